"""The suspects: which split outputs the forward cuts into parts.

One forward of the small unsharded model is traced with a `TorchFunctionMode` that follows every tensor derived from
the output of a module (or parameter) the plan splits on its output (`colwise`, `packed_colwise`). A `split` /
`chunk` / `unbind` / `narrow` / slice of such a tensor along a dimension that came from `out_features` is recorded
when it cuts the output into parts: along the outermost factor (the dimension a `colwise` shard cuts: `[Q_all | K_all
| V_all]`, `[gate | up]`), or in groups that are not one attention head (a per-head row that packs several
projections, `[head][q, k, v]`, or Qwen3-Next's `[key head][b, a]`). A reshape into heads is not a cut, and the
rotary halves of one head are not parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compat import parity as seam
from ..compat.logic import generic_name, parameter_rule
from ..compat.styles import is_split_output, shards_last_dim
from ..errors import ParityUnavailableError
from ..model import SplitOutput
from ..units import shorten
from .small_model import SmallModel, one_thread, small_model

# Same tensor, other dtype or memory: the index is unchanged.
KEEP_OPS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as", "contiguous", "clone", "detach",
                      "cpu"})
SHAPE_OPS = frozenset({
    "view", "reshape", "flatten", "unflatten", "view_as", "reshape_as", "squeeze", "unsqueeze", "expand", "expand_as",
    "transpose", "swapaxes", "swapdims", "permute", "movedim", "moveaxis", "t", "__get__", "repeat",
    "repeat_interleave", "flip",
    "__getitem__", "split", "split_with_sizes", "chunk", "tensor_split", "unbind", "narrow", "select", "index_select",
})
CUT_OPS = frozenset({"__getitem__", "split", "split_with_sizes", "chunk", "tensor_split", "unbind", "narrow", "select",
                     "index_select"})
_JOIN_OPS = frozenset({"cat", "concat", "concatenate", "stack"})
_MATMUL_OPS = frozenset({"linear", "matmul", "__matmul__", "mm", "bmm"})


def tensors(x):
    """Every tensor in `x` (a tensor, or nested lists / tuples of them)."""
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors(y)


def rule_for(plan: dict[str, str], name: str, is_param: bool) -> tuple[str | None, str | None]:
    """`(rule key, style)` for a concrete module or parameter name, as transformers looks it up: its generic name,
    and for a parameter its module's key when it has none of its own (`compat.logic.parameter_rule`, pinned to
    `parallel_utils._get_parameter_plan`). `(None, None)` when no rule applies."""
    key = parameter_rule(name, plan, is_weight=is_param)
    return (key, plan[key]) if key is not None else (None, None)


class Tracer:
    """Follows the out-feature index of every element derived from a split output through one forward.

    Each tracked tensor carries, per source, an int tensor of its own shape holding the index (in `[0, N)`, `N` the
    source's `out_features`) of the output feature each element came from (`-1` where it came from elsewhere). Shape
    ops (view, reshape, transpose, slicing, split, cat, ...) are replayed on that index tensor; elementwise ops keep
    it (for at most `MAX_HOPS` of them in a row: a cut comes right after the projection); a linear / matmul whose
    weight is tracked along its output dimension starts a new one; anything else drops it.

    A cut (split, chunk, unbind, narrow, slice, select) that hands a piece only some of the features is a cut into
    parts when the features a piece keeps do not repeat with the period of one head: blocks of the whole output
    (`[Q_all | K_all | V_all]`, `[gate | up]`, period `N`), per-head rows wider than any attention head of the config
    (`[head][q, k, v]`, period `3 * head_dim`), or groups of a width that is no head's (`[key head][b, a]`). The
    rotary halves of a head repeat every head and are not parts.
    """

    MAX_HOPS = 4

    def __init__(self, head_widths: tuple[int, ...]):
        self.tags = seam.weak_id_dict()
        self.total: dict[str, int] = {}
        self.found: dict[str, dict] = {}
        self.just_found: list[str] = []   # sources found by the op being propagated
        self.dead: set[str] = set()   # contracted by a matmul: the split is on the input features, not the output
        self.rows: dict[str, set[int]] = {}  # source -> widths of the rows its output was viewed into
        self.head_widths = set(head_widths)
        self.max_head = max(head_widths) if head_widths else 0

    def track(self, tensor, source: str, dim: int) -> None:
        import torch

        n = tensor.shape[dim]
        view = [1] * tensor.ndim
        view[dim] = n
        self.total[source] = n
        self.tags[tensor] = {source: (torch.arange(n).view(view).expand(tensor.shape), 0)}

    def _live(self, t) -> dict:
        tags = self.tags.get(t)
        return {s: v for s, v in tags.items() if s not in self.found and s not in self.dead} if tags else {}

    # -- propagation ---------------------------------------------------------------------------------------------------
    def propagate(self, func, args, kwargs, out) -> None:
        import torch

        name = getattr(func, "__name__", "")
        if name in _MATMUL_OPS:
            self._matmul(name, args, out)
            return
        tagged = [t for t in tensors(list(args) + list(kwargs.values())) if self._live(t)]
        if not tagged:
            return
        if name in _JOIN_OPS and args and isinstance(args[0], (list, tuple)):
            self._join(func, args, kwargs, out)
            return
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if name in KEEP_OPS and src is not None and isinstance(out, torch.Tensor) and out.shape == src.shape:
            self.tags[out] = self._live(src)
            return
        if name in SHAPE_OPS and src is not None and self._live(src):
            outs = list(tensors(out))
            results: dict[int, tuple] = {}
            for source, (idx, hops) in self._live(src).items():
                pieces = list(tensors(func(idx, *args[1:], **kwargs)))
                if any(p.is_floating_point() for p in pieces):
                    continue
                if len(pieces) != len(outs) or any(p.shape != o.shape for p, o in zip(pieces, outs)):
                    continue
                if name in CUT_OPS:
                    self._check_cut(name, source, idx, pieces)
                elif len(pieces) == 1:
                    inner = self._inner_width(pieces[0])
                    if inner is not None and inner < self.total.get(source, 0):
                        self.rows.setdefault(source, set()).add(inner)   # a view into rows (heads, groups)
                for o, piece in zip(outs, pieces):
                    results.setdefault(id(o), (o, {}))[1][source] = (piece, hops)
            for o, tags in results.values():
                self.tags[o] = tags
            return
        for o in tensors(out):
            for t in tagged:
                if o in self.tags:
                    break
                if t.shape == o.shape:
                    kept = {s: (idx, hops + 1) for s, (idx, hops) in self._live(t).items() if hops < self.MAX_HOPS}
                elif t.ndim == o.ndim:
                    kept = {s: (v, hops + 1) for s, (idx, hops) in self._live(t).items()
                            if hops < self.MAX_HOPS and (v := self._along(idx, o.shape)) is not None}
                else:
                    kept = {}
                if kept:
                    self.tags[o] = kept

    @staticmethod
    def _along(idx, shape):
        """The index for an output of another length along dimensions the index does not vary on (a depthwise
        convolution over the sequence keeps the channels): `None` when a dimension it varies on changed size."""
        for d in range(idx.ndim):
            if idx.shape[d] != shape[d]:
                first = idx.narrow(d, 0, 1)
                if not bool((first == idx).all()):
                    return None
                idx = first
        return idx.expand(shape)

    def _join(self, func, args, kwargs, out) -> None:
        import torch

        parts = list(args[0])
        live = [self._live(t) if isinstance(t, torch.Tensor) else {} for t in parts]
        tags = {}
        for source in {s for tags_ in live for s in tags_}:
            idx = [tags_[source][0] if source in tags_ else torch.full(t.shape, -1, dtype=torch.long)
                   for t, tags_ in zip(parts, live)]
            tags[source] = (func(idx, *args[1:], **kwargs), max(t[source][1] for t in live if source in t))
        if isinstance(out, torch.Tensor):
            self.tags[out] = tags

    def _matmul(self, name, args, out) -> None:
        import torch

        if not isinstance(out, torch.Tensor) or len(args) < 2 or not isinstance(args[1], torch.Tensor):
            return
        weight = args[1]
        out_dim = 0 if name == "linear" else weight.ndim - 1   # linear: y = x W^T, the output is W's dim 0
        tags = {}
        for source, (idx, _) in self._live(weight).items():
            line = idx.movedim(out_dim, -1).reshape(-1, idx.shape[out_dim])
            if (line[:1] == line).all() and (line[0] >= 0).all():   # the index varies along the output dim only
                shape = [1] * out.ndim
                shape[-1] = out.shape[-1]
                tags[source] = (line[0].view(shape).expand(out.shape), 0)
            elif source in self.total and source not in self.found:
                self.dead.add(source)
        if tags:
            self.tags[out] = tags

    # -- the verdict ---------------------------------------------------------------------------------------------------
    def _period(self, keep, support, n: int) -> int:
        """Smallest `p` dividing `n` such that, where both `x` and `x + p` are features of the input, a piece keeps
        `x` exactly when it keeps `x + p`; `n` when none."""
        for p in range(1, n):
            if n % p:
                continue
            both = support[:-p] & support[p:]
            if bool((keep[:-p][both] == keep[p:][both]).all()):
                return p
        return n

    @staticmethod
    def _values(idx):
        """The distinct feature indices in `idx`, without sorting the copies a broadcast made."""
        for d in range(idx.ndim):
            if idx.shape[d] > 1 and (idx.stride(d) == 0 or bool((idx == idx.narrow(d, 0, 1)).all())):
                idx = idx.narrow(d, 0, 1)
        flat = idx.reshape(-1)
        return flat[flat >= 0].unique()

    @staticmethod
    def _inner_width(idx) -> int | None:
        """The size of the dimension along which the features of `idx` run consecutively (`+1` per step): the last
        dimension of a view into heads (`[..., heads, head_dim]` -> `head_dim`), or of groups (`[..., groups, 4]` ->
        4); `None` when no dimension does."""
        for d in range(idx.ndim - 1, -1, -1):
            if idx.shape[d] < 2:
                continue
            a, b = idx.narrow(d, 0, idx.shape[d] - 1), idx.narrow(d, 1, idx.shape[d] - 1)
            both = (a >= 0) & (b >= 0)
            if bool(both.any()) and bool(((b - a)[both] == 1).all()):
                return int(idx.shape[d])
        return None

    def _within_head(self, period: int, idx, source: str) -> bool:
        """A cut that repeats every `period` features cuts inside each head (rotary halves, a head's rotary and
        pass-through dims, every other feature) when the output was viewed into rows of one head's width (a head
        width of the config: `[..., heads, head_dim]`) and the cut repeats within such a row. An output viewed only
        into rows of other widths holds groups of packed projections (`[q, gate]` per head, `[b, a]` per key head),
        whatever their size."""
        if period > self.max_head:
            return False
        if not self.head_widths:
            return True
        rows = self.rows.get(source) or {self._inner_width(idx)}
        return any(row in self.head_widths and period <= row for row in rows if row is not None)

    def _check_cut(self, name, source, idx, pieces) -> None:
        import torch

        if source in self.found:
            return
        n = self.total[source]
        support = torch.zeros(n, dtype=torch.bool)
        values = self._values(idx)
        support[values] = True
        for piece in pieces:
            kept = self._values(piece)
            if kept.numel() == values.numel():
                continue
            keep = torch.zeros(n, dtype=torch.bool)
            keep[kept] = True
            period = self._period(keep, support, n)
            if period < n and self._within_head(period, idx, source):
                return   # a cut inside each head (rotary halves): not parts
            widths = [int(p[p >= 0].unique().numel()) for p in pieces]
            op = "slice" if name == "__getitem__" else name
            total = int(values.numel())
            if period >= n:
                where = "blocks of the whole output"
            elif period > self.max_head:
                where = (f"per-head rows of {period} features, wider than any head ({self.max_head}): several "
                         "projections packed per head")
            else:
                where = (f"groups of {period} features, no head's width: several projections packed per group "
                         f"({n // period} groups)")
            self.just_found.append(source)
            self.found[source] = {
                "action": f"{op} into parts of {widths} features out of {total}, {where}",
                "cut": "blocks" if period >= n else "groups", "op": op, "parts": tuple(widths), "total": n,
                "period": min(period, n)}
            return


@dataclass(frozen=True)
class CutSite:
    """Where the unsharded forward cut a split output into parts, so that a rank's forward can be caught at the same
    op: the module call it ran in (concrete name, call index), the torch function, and which call of that function
    within the module call it was; and the pieces it produced (the unsharded parts).

    Counting torch functions per innermost module call is what makes the site findable on a rank: transformers' TP
    hooks run inside the hooked module's own call, so the ops of the module that cuts are the same on both sides."""

    call: tuple[str, int]
    op: str
    occurrence: int
    pieces: tuple


class CallCounter:
    """Which module call is innermost (forward pre/post hooks on every module) and how many times each torch function
    ran directly in it."""

    def __init__(self, model):
        self.stack: list[tuple[str, int]] = []
        self.calls: dict[str, int] = {}
        self.counts: dict[tuple, int] = {}
        self.handles = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(self._pre(name)))
            self.handles.append(mod.register_forward_hook(self._post(name)))

    def _pre(self, name):
        def hook(module, args):
            idx = self.calls.get(name, 0)
            self.calls[name] = idx + 1
            self.stack.append((name, idx))
        return hook

    def _post(self, name):
        def hook(module, args, output):
            if self.stack and self.stack[-1][0] == name:
                self.stack.pop()
        return hook

    def count(self, op: str) -> tuple[tuple[str, int] | None, int]:
        """`(innermost call, occurrence)` of a torch function `op` about to run."""
        top = self.stack[-1] if self.stack else None
        key = (top, op)
        self.counts[key] = self.counts.get(key, 0) + 1
        return top, self.counts[key]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def trace(small: SmallModel) -> tuple[dict[str, SplitOutput], list[str]]:
    """Run one traced forward of `small.reference` and return `{generic source name: SplitOutput}` for the split
    outputs the forward cuts into parts, and the generic names of every split output it followed. The site of each
    cut and the parts it produced are kept on `small.cut_sites` (see `CutSite`). Followed: the outputs of modules and
    parameters whose style leaves them split (`styles.is_split_output`; gathered styles hand every rank the whole
    output, so the model never sees a part), and experts parameters whose style shards their last dimension
    (`styles.shards_last_dim`: on an `[E, in, out]` tensor, gpt-oss, that is the output dimension)."""
    import torch

    model = small.reference
    tracer = Tracer(small.head_widths)
    sources: dict[str, tuple[str, str]] = {}
    sites: dict[str, CutSite] = {}
    handles = []
    params = dict(model.named_parameters())
    for pname, p in params.items():
        rule, style = rule_for(small.plan, pname, is_param=True)
        if generic_name(pname) != rule or p.ndim < 2:
            continue
        # a parameter with its own rule (experts): follow the dimension its style shards, and see whether it
        # becomes the output of a matmul (`[E, out, in]` colwise, `[E, in, out]` rowwise) or is contracted away
        dim = p.ndim - 2 if is_split_output(style) else p.ndim - 1 if shards_last_dim(style) else None
        if dim is not None:
            g = generic_name(pname)
            sources[g] = (rule, style)
            tracer.track(p, g, dim)
    for mname, mod in model.named_modules():
        rule, style = rule_for(small.plan, mname, is_param=False)
        if not is_split_output(style) or not hasattr(mod, "weight") or getattr(mod.weight, "ndim", 0) != 2:
            continue
        g = generic_name(mname)
        sources[g] = (rule, style)

        def hook(module, inputs, output, g=g):
            t = next(tensors(output if isinstance(output, (tuple, list)) else (output,)), None)
            if t is not None:
                tracer.track(t, g, t.ndim - 1)

        handles.append(mod.register_forward_hook(hook))

    counter = CallCounter(model)

    class Mode(seam.function_mode()):  # type: ignore[misc]  # torch's TorchFunctionMode, read as untyped
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            call, occurrence = counter.count(name)
            out = func(*args, **kwargs)
            try:
                tracer.propagate(func, args, kwargs, out)
                for source in tracer.just_found:
                    if call is not None:
                        sites[source] = CutSite(call, name, occurrence, tuple(t.detach().clone()
                                                                              for t in tensors(out)))
            except Exception:  # noqa: BLE001 - following a tensor must never change the forward
                pass
            tracer.just_found.clear()
            return out

    try:
        with torch.no_grad(), Mode():
            model(input_ids=small.input_ids)
    finally:
        counter.remove()
        for h in handles:
            h.remove()
    found = {g: SplitOutput(module=g, rule=sources[g][0], style=sources[g][1], **tracer.found[g])
             for g in sorted(sources) if g in tracer.found}
    small.found, small.traced = found, True
    small.cut_sites = {g: site for g, site in sites.items() if g in found}
    return found, sorted(sources)


def split_outputs(config, model_class, tp_plan: dict | None, tp_size: int, *, seed: int = 0,
                  checkpoint_keys=None, small: SmallModel | None = None) -> list[SplitOutput]:
    """The modules (or parameters) `tp_plan` splits on their output whose output the model's forward then cuts into
    parts: the projections a static check cannot judge and the parity check should.

    Found from evidence, not names: one forward of the small unsharded model (see `build_small_model`) is traced
    (see `Tracer`): `q_proj: colwise` viewed into heads is not a cut; GPT-NeoX's `query_key_value` viewed per head
    and chunked into q, k, v is; phi3's `qkv_proj` sliced into `[Q | K | V]` is; `packed_colwise` experts'
    `gate_up_proj` chunked into gate and up is. Gathered styles (`colwise_gather_output`) hand every rank the whole
    output and are not suspects. Costs one build and one forward of the small model (about a second).

    Args:
        config (`PretrainedConfig`): the real config.
        model_class (`type | str`): the class the real model uses.
        tp_plan (`dict[str, str]`, *optional*): `base_model_tp_plan` under review; `None` = what the config ships.
        tp_size (`int`): the tp_size under review (the small model keeps its divisibility).
        seed (`int`): seed of the small model's weights and input.
        checkpoint_keys (`Iterable[str]`, *optional*): the real checkpoint's tensor names (see `build_small_model`).
        small (`SmallModel`, *optional*): one `small_model` built from the same arguments, traced instead of a new
            build (and left for the caller to clean up, so that `run_parity` can reuse it).

    Returns:
        `list[SplitOutput]`, sorted by name; empty when the forward cuts no split output into parts.

    Raises:
        UsageError: `model_class` is not a transformers model class, or `tp_size < 1`.
        ParityUnavailableError: the small model cannot be built or run from this config (no evidence either way).
    """
    own = small is None
    with one_thread():
        if own:
            small = small_model(config, model_class, tp_plan, tp_size, seed=seed, checkpoint_keys=checkpoint_keys)
        try:
            found, _ = trace(small)
        except Exception as e:  # noqa: BLE001 - whatever the small model's forward raises: no evidence, and says so
            why = shorten(f"{type(e).__name__}: {e}", 160, words=False)
            raise ParityUnavailableError(f"the parity check cannot run a small {small.model_class.__name__}: "
                                         f"{why}") from None
        finally:
            if own:
                small.cleanup()
    return list(found.values())
