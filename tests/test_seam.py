"""The seam's protocol: every release line implements all of `compat._seam.Seam` (checked when its module is
imported), the protocol names every public member a line offers, and a line that lacks a member or changes a
signature fails at import with a message naming it, not in the middle of a check."""

from __future__ import annotations

import inspect

import pytest

from tpaudit.compat import _lines
from tpaudit.compat._seam import Seam, require_seam, seam_members
from tpaudit.compat.transformers_5_23 import Transformers523


def _public_members(cls: type) -> set[str]:
    """Public methods and class attributes of a release-line class (its mixins included), and its declared
    instance attributes."""
    names = {n for n in dir(cls) if not n.startswith("_")}
    for c in cls.__mro__:
        names |= {n for n in getattr(c, "__annotations__", {}) if not n.startswith("_")}
    return names


def test_every_release_line_implements_the_protocol():
    for line in _lines():
        assert require_seam(line) is line
        assert not set(seam_members()) - _public_members(line), line


def test_the_protocol_names_every_public_member_of_every_line():
    """A method a line adds and callers use must be in the protocol (else the type checker refuses the call, and a
    later line could lack it without failing at import)."""
    for line in _lines():
        assert _public_members(line) - set(seam_members()) == set(), line.__name__


def test_the_protocol_has_the_members_written_in_it():
    """`seam_members()` reads the protocol class: methods, the classmethod `probe`, and annotated attributes."""
    members = set(seam_members())
    assert {"shard", "resolve_plans", "quiet", "probe", "plan_in_force", "accepted_ep_sizes"} <= members
    assert {"LINE", "SUPPORTED", "TESTED_RELEASES", "CAPABILITIES", "STYLES", "versions", "tested"} <= members
    assert "__init__" not in members
    assert len(members) == len({n for n in vars(Seam) if not n.startswith("_")} | set(Seam.__annotations__))


def test_a_line_missing_a_method_fails_when_its_class_is_made():
    with pytest.raises(TypeError) as e:
        @require_seam
        class Broken(Transformers523):
            shard = None  # noqa: F841 - a line that drops the method
        del Broken
    # a class without the members at all:
    with pytest.raises(TypeError) as missing:
        require_seam(type("Bare", (), {"LINE": "9.9"}))
    text = str(missing.value)
    assert "Bare does not implement the seam" in text
    for name in ("shard is missing", "resolve_plans is missing", "STYLES is missing", "versions is missing"):
        assert name in text
    assert "LINE is missing" not in text
    assert "shard is not a method" in str(e.value)


def test_a_line_that_changes_a_signature_fails_when_its_class_is_made():
    with pytest.raises(TypeError, match=r"local_shape\(self, global_shape, placements, mesh_size\)"):
        @require_seam
        class Narrower(Transformers523):
            def local_shape(self, global_shape, placements, mesh_size):  # the rank parameter dropped
                return global_shape


def test_the_check_compares_parameter_kinds_too():
    """A keyword-only parameter made positional is a different signature."""
    ours = inspect.signature(Transformers523.load_config).parameters["trust_remote_code"].kind
    assert ours is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError, match="load_config"):
        @require_seam
        class Positional(Transformers523):
            def load_config(self, directory, trust_remote_code, has_auto_map):
                return None
