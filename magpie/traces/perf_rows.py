"""Which calls make TraceLens's perf rows: those of `unified_perf_summary.csv` and of the family
sheets (GEMM, CONV_fwd, SDPA_fwd, Unary/BinaryElementwise, Reduce_fwd, Normalization).

A unified row is TraceLens's unit of modelled work, found walking each thread's op tree from
the top: the outermost op TraceLens models (`perf_models.models_whole_op`) with GPU work inside
it, counted with everything launched inside it (aten::convolution with the cudnn_convolution and
the bias add under it); else, where no such op is further down, an op that launched work itself,
with its children's; else the walk goes on into the children. A kernel (memcpy, memset) that no
row covers is a call of its own: '<op>-><kernel> (Synthetic Op)', of the innermost op around it
(an op's own kernels beside children that are rows, with the op's arguments) or, outside any op,
of the runtime call that launched it (`signature_groups` makes those).

A family sheet lists every call of the ops TraceLens files on it, wherever they nest (a layer_norm
and the native_layer_norm inside it are two rows), grouped by the model's parameters.
"""

from __future__ import annotations

from operator import attrgetter

import msgspec

from magpie.traces.ingest import Trace
from magpie.traces.kernels import gemm_transposes
from magpie.traces.ops_tables import (SYNTHETIC, SignatureGroup, busy_time, op_category, op_parents, ops_tables,
                                      signature_groups, where_of)
from magpie.traces.perf_models import TRACELENS_MODELS, Estimate, estimate, models_whole_op


class _Tree:
    """The trace's op nesting with the GPU work under each op, built once for both kinds of rows."""

    def __init__(self, trace: Trace, parents: dict[int, int], groups: list[SignatureGroup]):
        self.trace, self.parents = trace, parents
        # each op that launched work itself: what it launched, and its signature's group (a call of
        # a signature group is one op's launches)
        self.direct: dict[int, list] = {}
        self.launcher_groups: dict[int, SignatureGroup] = {}
        for group in groups:
            if group.op is not None:
                for launched in group.calls:
                    self.direct[launched[0].op] = launched
                    self.launcher_groups[launched[0].op] = group
        self.busy: set[int] = set()  # ops with GPU work at or under them
        self.children: dict[int, list[int]] = {}  # of the busy ops: the busy ones, in time order
        self.roots: list[int] = []  # the busy ops no op encloses, in time order
        for op in self.direct:
            while op is not None and op not in self.busy:
                self.busy.add(op)
                parent = parents.get(op)
                if parent is None:
                    self.roots.append(op)
                else:
                    self.children.setdefault(parent, []).append(op)
                op = parent
        ops = trace.cpu_ops
        for siblings in (*self.children.values(), self.roots):
            if len(siblings) > 1:
                siblings.sort(key=lambda op: ops[op].ts)
        modelled_names = {name: models_whole_op(name) for name in {ops[op].name for op in self.busy}}
        self.modelled = {op for op in self.busy if modelled_names[ops[op].name]}  # TraceLens models them whole
        self.modelled_below: set[int] = set()  # ops with a modelled op under them
        for op in self.modelled:
            above = parents.get(op)
            while above is not None and above not in self.modelled_below:
                self.modelled_below.add(above)
                above = parents.get(above)
        # both kinds of rows ask for the same ops: each answer is kept
        self.subtrees: dict[int, list] = {}
        self.signatures: dict[int, tuple[bytes, Estimate | None]] = {}
        self.estimates: dict[bytes, Estimate | None] = {}
        self.places: dict[tuple, tuple] = {}

    def subtree(self, op: int) -> list:
        """The activities an op launched, itself or through the ops inside it, in time order."""
        found = self.subtrees.get(op)
        if found is None:
            found, pending = list(self.direct.get(op, ())), list(self.children.get(op, ()))
            while pending:
                at = pending.pop()
                found += self.direct.get(at, ())
                pending += self.children.get(at, ())
            found = self.subtrees[op] = sorted(found, key=_START)
        return found

    def signature(self, op: int) -> tuple[bytes, Estimate | None]:
        """An op's name and arguments as a key, and its model's estimate, evaluated once per signature."""
        found = self.signatures.get(op)
        if found is None:
            call = self.trace.cpu_ops[op]
            key = msgspec.json.encode((call.name, call.input_dims, call.input_types, call.strides, call.concrete))
            if key not in self.estimates:
                self.estimates[key] = estimate(call)
            found = self.signatures[op] = key, self.estimates[key]
        return found

    def where(self, call) -> tuple:
        """where_of(trace, call), once per thread."""
        place = (call.pid, call.tid)
        found = self.places.get(place)
        if found is None:
            found = self.places[place] = where_of(self.trace, call)
        return found

    def transposes(self, op: int, est: Estimate) -> tuple | None:
        """A GEMM call's transposes, from its first GEMM kernel's name (TraceLens reads them there)."""
        if est.family != "GEMM":
            return None
        return next((t for t in map(gemm_transposes, (a.name for a in self.subtree(op))) if t is not None), None)

    def walk(self) -> tuple[list[int], set[int]]:
        """The ops that are unified rows, in the order TraceLens's walk meets them, and the ops
        it went through into their children (what those launched themselves is in no row)."""
        rows, through, pending = [], set(), self.roots[::-1]
        while pending:
            op = pending.pop()
            if op in self.modelled or (op in self.direct and op not in self.modelled_below):
                rows.append(op)
            else:
                through.add(op)
                pending += reversed(self.children.get(op, ()))
        return rows, through


_START = attrgetter("ts")


def _params(est: Estimate, transposes: tuple | None) -> dict:
    """The model's parameters of one call: its estimate's, with a GEMM's transposes."""
    return est.params if transposes is None else {**est.params, "transpose": transposes}


def _add_call(group: SignatureGroup, launched: list, cpu_duration: float) -> None:
    group.times.append(busy_time(launched) if launched else 0.0)
    group.calls.append(launched)
    group.cpu.append(cpu_duration)


def perf_groups(trace: Trace, groups: list[SignatureGroup],
                tree: _Tree) -> tuple[list[SignatureGroup], dict[tuple, SignatureGroup]]:
    """The unified rows' groups (calls of one op and signature, or one synthetic op), most GPU
    time first, ties to the first called, and those of ops by the calls they hold (op indices,
    ascending); `groups` are the trace's signature groups: their launches outside any op are
    TraceLens's synthetic ops as they stand, and where every call of a signature is a row that
    launched its work itself, the signature's group is the row's (its statistics worked out once)."""
    ops, uids = trace.cpu_ops, trace.op_uids
    row_ops, through = tree.walk()
    leaf_rows: dict[int, list[int]] = {}  # signature group -> its calls that are rows launching their work
    for op in row_ops:
        group = tree.launcher_groups.get(op)
        if group is not None and op not in tree.children:
            leaf_rows.setdefault(id(group), []).append(op)
    rows: list[SignatureGroup] = [g for g in groups if g.op is None]
    by_calls: dict[tuple, SignatureGroup] = {}
    reused: set[int] = set()
    for members in leaf_rows.values():
        group = tree.launcher_groups[members[0]]
        if len(members) == len(group.times):
            group.params = _params(group.est, tree.transposes(members[0], group.est)) if group.est else {}
            rows.append(group)
            by_calls[tuple(sorted(members))] = group
            reused.add(id(group))
    built: dict[tuple, list[int]] = {}  # the other rows by signature, in the walk's order
    for op in row_ops:
        group = tree.launcher_groups.get(op)
        if group is None or id(group) not in reused or op in tree.children:
            built.setdefault((tree.signature(op)[0], tree.where(ops[op])), []).append(op)
    for (_, where), members in built.items():
        first, est = ops[members[0]], tree.signature(members[0])[1]
        own = [a.name for a in tree.direct.get(members[0], ()) if a.kind == "kernel"]
        group = SignatureGroup(first.name, first, est, op_category(first.name, est.family if est else None, own),
                               first.name, where=where, uid=uids[members[0]],
                               params=_params(est, tree.transposes(members[0], est)) if est else {})
        for op in members:
            _add_call(group, tree.subtree(op), ops[op].dur)
        rows.append(group)
        by_calls[tuple(sorted(members))] = group
    # TraceLens numbers these after the trace's events and the synthetic ops outside any op
    synthetic_uid = trace.events + sum(len(g.times) for g in groups if g.op is None)
    synthetic: dict[tuple, SignatureGroup] = {}
    for activity in trace.gpu:
        if activity.op not in through:
            continue
        call = ops[activity.op]
        key, est = tree.signature(activity.op)
        name, where = SYNTHETIC.format(call.name, activity.name), tree.where(call)
        group = synthetic.get((name, key, where))
        if group is None:
            own = [a.name for a in tree.direct[activity.op] if a.kind == "kernel"]
            group = synthetic[(name, key, where)] = SignatureGroup(
                name, call, None, op_category(call.name, est.family if est else None, own), call.name,
                where=where, uid=synthetic_uid)
        synthetic_uid += 1
        _add_call(group, [activity], call.dur)
    return sorted([*rows, *synthetic.values()], key=lambda g: (-g.total, g.uid)), by_calls


def sheet_groups(trace: Trace, tree: _Tree, rows_by_calls: dict[tuple, SignatureGroup],
                 idle_calls: bool = True) -> dict[str, list[SignatureGroup]]:
    """Per family sheet, the calls of its ops grouped by op name and model parameters, most GPU
    time first, ties to the first called. With `idle_calls`, calls that launched nothing are
    rows too (TraceLens lists every call); a stage view leaves them out, having no time of them.
    A group of the very calls of a unified row's (`rows_by_calls`, from perf_groups) is that
    row's group, its statistics worked out once."""
    ops = trace.cpu_ops
    slots: dict[tuple, tuple] = {}  # (signature, transposes) -> (sheet, op name, parameters' repr)
    params_of: dict[tuple, dict] = {}
    members: dict[tuple, list[int]] = {}
    for op, call in enumerate(ops):
        sheet = TRACELENS_MODELS.get(call.name)
        if sheet is None:
            continue
        launcher = tree.launcher_groups.get(op)
        if launcher is not None and op not in tree.children:
            signature, est = id(launcher), launcher.est  # its calls are alike: the group stands for their signature
        elif op in tree.busy or idle_calls:
            signature, est = tree.signature(op)
        else:
            continue
        if est is None:
            continue
        transposes = tree.transposes(op, est)
        slot = slots.get((signature, transposes))
        if slot is None:
            params = _params(est, transposes)
            slot = slots[(signature, transposes)] = (sheet, call.name, repr(params))
            params_of.setdefault(slot, params)
        members.setdefault(slot, []).append(op)
    sheets: dict[str, list[SignatureGroup]] = {}
    for slot, calls in members.items():
        group = rows_by_calls.get(tuple(calls))
        if group is None:
            first = ops[calls[0]]
            group = SignatureGroup(first.name, first, tree.signature(calls[0])[1], "", first.name,
                                   where=tree.where(first), uid=trace.op_uids[calls[0]], params=params_of[slot])
            for op in calls:
                _add_call(group, tree.subtree(op), ops[op].dur)
        sheets.setdefault(slot[0], []).append(group)
    return {sheet: sorted(found, key=lambda g: (-g.total, g.uid)) for sheet, found in sheets.items()}


def trace_tables(trace: Trace, arch=None, parents: dict[int, int] | None = None,
                 idle_calls: bool = True) -> tuple[list[SignatureGroup], dict[str, list[dict]]]:
    """The trace's signature groups and all its op tables; `parents` (op_parents of the trace, or
    of the trace a stage view was cut from) spares rebuilding the nesting."""
    if parents is None:
        parents = op_parents(trace)
    groups = signature_groups(trace, parents)
    tree = _Tree(trace, parents, groups)
    perf, rows_by_calls = perf_groups(trace, groups, tree)
    return groups, ops_tables(groups, perf, sheet_groups(trace, tree, rows_by_calls, idle_calls), arch)
