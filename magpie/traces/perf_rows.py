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

As TraceLens's, the rows leave out collective communication (an op TraceLens does not model
that launched NCCL/RCCL kernels, and such kernels outside any row): it is no modelled work.

Most ops that launched work are plain: no op around them launched work itself or is modelled,
and nothing inside them launched any; each of their calls is then its own row with what it
launched, which is its signature group's call, so the walk is only needed around the others.
"""

from __future__ import annotations

from itertools import compress
from operator import attrgetter, itemgetter

import msgspec

from magpie.traces.ingest import Trace
from magpie.traces.kernels import category, gemm_transposes
from magpie.traces.ops_tables import (SYNTHETIC, SignatureGroup, busy_time, op_category, ops_tables,
                                      signature_groups, where_of)
from magpie.traces.perf_models import TRACELENS_MODELS, Estimate, estimate, models_whole_op


class _Nesting:
    """The trace's ops as the perf rows need them: each launching op's signature group and
    launches; which launching ops are not plain (`complex`), and around them (the region) the op
    tree with the GPU work under each op; the signature groups with such a call (`mixed`)."""

    def __init__(self, trace: Trace, parents: dict[int, int], groups: list[SignatureGroup]):
        self.trace, self.parents = trace, parents
        ops = trace.cpu_ops
        # a call of an op's signature group is one op's launches (a million events hold some 10^5
        # of them: filled by dict and zip, not one Python step each)
        self.group_of: dict[int, SignatureGroup] = {}
        self.launches: dict[int, list] = {}
        self.ops_of: dict[int, list[int]] = {}  # id(signature group) -> its ops, in call order
        for group in groups:
            if group.op is not None:
                members = self.ops_of[id(group)] = list(map(_OP, map(_FIRST, group.calls)))
                self.group_of.update(dict.fromkeys(members, group))
                self.launches.update(zip(members, group.calls))
        clear: dict[int, bool] = {}  # an op around launchers: it and every op around it neither launch nor are modelled
        enclosing: set[int] = set()  # launchers with launchers inside them
        self.complex: set[int] = set()  # the launchers that are not plain
        for op in [op for op in self.launches if op in parents]:  # the others are plain unless enclosing
            path, above = [], parents.get(op)
            while above is not None and above not in self.launches and above not in clear:
                path.append(above)
                above = parents.get(above)
            if above is None:
                status = True
            elif above in self.launches:
                enclosing.add(above)  # the nearest one: those further out are the nearest to it
                status = False
            else:
                status = clear[above]
            for around in reversed(path):
                status = status and not models_whole_op(ops[around].name)
                clear[around] = status
            if not status:
                self.complex.add(op)
        self.complex |= enclosing
        # the signature groups with a call that is not plain (id -> group)
        self.mixed = {id(self.group_of[op]): self.group_of[op] for op in self.complex}
        self.busy: set[int] = set()  # the region: the complex launchers and every op around them
        self.children: dict[int, list[int]] = {}  # of its ops: those in it, in time order
        self.roots: list[int] = []  # its ops no op encloses, in time order
        for op in self.complex:
            while op is not None and op not in self.busy:
                self.busy.add(op)
                parent = parents.get(op)
                if parent is None:
                    self.roots.append(op)
                else:
                    self.children.setdefault(parent, []).append(op)
                op = parent
        for siblings in (*self.children.values(), self.roots):
            if len(siblings) > 1:
                siblings.sort(key=lambda op: ops[op].ts)
        self.modelled = {op for op in self.busy if models_whole_op(ops[op].name)}  # TraceLens models them whole
        self.modelled_below: set[int] = set()  # ops with a modelled op under them
        for op in self.modelled:
            above = parents.get(op)
            while above is not None and above not in self.modelled_below:
                self.modelled_below.add(above)
                above = parents.get(above)
        # the rows and the sheets ask for the same ops: each answer is kept
        self.subtrees: dict[int, list] = {}
        self.signatures: dict[int, tuple[bytes, Estimate | None]] = {}
        self.estimates: dict[bytes, Estimate | None] = {}
        self.places: dict[tuple, tuple] = {}

    def subtree(self, op: int) -> list:
        """The activities an op launched, itself or through the ops inside it."""
        if op not in self.busy:  # plain, or launched nothing
            return self.launches.get(op, [])
        found = self.subtrees.get(op)
        if found is None:
            found, pending = [], [op]
            while pending:
                at = pending.pop()
                found += self.launches.get(at, ())
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
        launched = self.subtree(op)
        if len(launched) == 1:  # most calls: nothing to order
            return gemm_transposes(launched[0].name)
        launched = sorted(launched, key=_START)
        return next((t for t in map(gemm_transposes, (a.name for a in launched)) if t is not None), None)

    def walk(self) -> tuple[list[int], set[int]]:
        """The region's ops that are unified rows, in the order TraceLens's walk meets them, and
        those it went through into their children (what they launched themselves is in no row)."""
        rows, through, pending = [], set(), self.roots[::-1]
        while pending:
            op = pending.pop()
            if op in self.modelled or (op in self.launches and op not in self.modelled_below):
                rows.append(op)
            else:
                through.add(op)
                pending += reversed(self.children.get(op, ()))
        return rows, through


_START, _OP, _NAME, _FIRST = attrgetter("ts"), attrgetter("op"), attrgetter("name"), itemgetter(0)


def _params(est: Estimate, transposes: tuple | None) -> dict:
    """The model's parameters of one call: its estimate's, with a GEMM's transposes."""
    return est.params if transposes is None else {**est.params, "transpose": transposes}


def _communicates(launched: list) -> bool:
    return any(category(a.name, a.kind) == "communication" for a in launched)


def _add_call(group: SignatureGroup, launched: list, cpu_duration: float) -> None:
    group.times.append(busy_time(launched) if launched else 0.0)
    group.calls.append(launched)
    group.cpu.append(cpu_duration)


def perf_groups(trace: Trace, groups: list[SignatureGroup],
                nesting: _Nesting) -> tuple[list[SignatureGroup], dict[tuple, SignatureGroup]]:
    """The unified rows' groups (calls of one op and signature, or one synthetic op), most GPU
    time first, ties to the first called, and those of ops by the calls they hold (op indices,
    ascending); `groups` are the trace's signature groups: their launches outside any op are
    TraceLens's synthetic ops as they stand, and one whose calls are all plain is its row's."""
    ops, uids = trace.cpu_ops, trace.op_uids
    row_ops, through = nesting.walk()
    # a mixed group's plain calls are rows of their own signature too
    others = row_ops + [op for group_id in nesting.mixed for op in nesting.ops_of[group_id]
                        if op not in nesting.complex]
    built: dict[tuple, list[int]] = {}
    for op in sorted(others, key=lambda op: ops[op].ts):
        if op in nesting.modelled or not _communicates(nesting.subtree(op)):
            built.setdefault((nesting.signature(op)[0], nesting.where(ops[op])), []).append(op)
    rows: list[SignatureGroup] = [g for g in groups if g.op is None and not _communicates(g.calls[0])]
    by_calls: dict[tuple, SignatureGroup] = {}
    for group in groups:
        # a signature's calls launch alike: its first call says whether it communicates
        if group.op is None or id(group) in nesting.mixed or (
                not models_whole_op(group.name) and _communicates(group.calls[0])):
            continue
        members = nesting.ops_of[id(group)]
        key = (nesting.signature(members[0])[0], group.where)
        if key in built:  # an op of this signature is a row elsewhere (in the region): all in one row
            built[key] += members
            continue
        est = group.est
        group.params = _params(est, nesting.transposes(members[0], est)) if est else {}
        rows.append(group)
        by_calls[tuple(sorted(members))] = group
    for (_, where), members in built.items():
        members.sort(key=lambda op: ops[op].ts)
        first, est = ops[members[0]], nesting.signature(members[0])[1]
        own = nesting.launches.get(members[0], [])
        group = SignatureGroup(first.name, first, est, op_category(first.name, est.family if est else None, own),
                               first.name, where=where, uid=uids[members[0]],
                               params=_params(est, nesting.transposes(members[0], est)) if est else {})
        for op in members:
            _add_call(group, nesting.subtree(op), ops[op].dur)
        rows.append(group)
        by_calls[tuple(sorted(members))] = group
    # TraceLens numbers these after the trace's events and the synthetic ops outside any op
    synthetic_uid = trace.events + sum(len(g.times) for g in groups if g.op is None)
    synthetic: dict[tuple, SignatureGroup] = {}
    for activity in trace.gpu if through else ():
        if activity.op not in through or _communicates([activity]):
            continue
        call = ops[activity.op]
        key, est = nesting.signature(activity.op)
        name, where = SYNTHETIC.format(call.name, activity.name), nesting.where(call)
        group = synthetic.get((name, key, where))
        if group is None:
            own = nesting.launches[activity.op]
            group = synthetic[(name, key, where)] = SignatureGroup(
                name, call, None, op_category(call.name, est.family if est else None, own), call.name,
                where=where, uid=synthetic_uid)
        synthetic_uid += 1
        _add_call(group, [activity], call.dur)
    return sorted([*rows, *synthetic.values()], key=lambda g: (-g.total, g.uid)), by_calls


def sheet_groups(trace: Trace, nesting: _Nesting, rows_by_calls: dict[tuple, SignatureGroup],
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

    def slot_of(signature, est: Estimate, op: int) -> tuple:
        transposes = nesting.transposes(op, est)
        slot = slots.get((signature, transposes))
        if slot is None:
            params = _params(est, transposes)
            slot = slots[(signature, transposes)] = (TRACELENS_MODELS[ops[op].name], ops[op].name, repr(params))
            params_of.setdefault(slot, params)
        return slot

    # a signature group whose calls are all plain stands for their signature: its calls go on
    # its sheet together (a GEMM's one by one: their kernels name their transposes)
    placed: set[int] = set()
    for group_id, calls in nesting.ops_of.items():
        group = nesting.group_of[calls[0]]
        if group_id in nesting.mixed or group.name not in TRACELENS_MODELS or group.est is None:
            continue
        placed.update(calls)
        if group.est.family == "GEMM":
            for op in calls:
                members.setdefault(slot_of(group_id, group.est, op), []).append(op)
        else:
            members.setdefault(slot_of(group_id, group.est, calls[0]), []).extend(calls)
    if idle_calls:  # every op of the trace: picked by name in C, not one Python step per op
        candidates = compress(range(len(ops)), map(TRACELENS_MODELS.__contains__, map(_NAME, ops)))
    else:
        candidates = [op for op in nesting.launches.keys() | nesting.busy if ops[op].name in TRACELENS_MODELS]
    for op in [op for op in candidates if op not in placed]:
        signature, est = nesting.signature(op)
        if est is not None:
            members.setdefault(slot_of(signature, est, op), []).append(op)
    sheets: dict[str, list[SignatureGroup]] = {}
    for slot, calls in members.items():
        calls.sort()
        group = rows_by_calls.get(tuple(calls))
        if group is None:
            first = ops[calls[0]]
            group = SignatureGroup(first.name, first, nesting.signature(calls[0])[1], "", first.name,
                                   where=nesting.where(first), uid=trace.op_uids[calls[0]], params=params_of[slot])
            for op in calls:
                _add_call(group, nesting.subtree(op), ops[op].dur)
        sheets.setdefault(slot[0], []).append(group)
    return {sheet: sorted(found, key=lambda g: (-g.total, g.uid)) for sheet, found in sheets.items()}


def trace_tables(trace: Trace, arch=None,
                 idle_calls: bool = True) -> tuple[list[SignatureGroup], dict[str, list[dict]]]:
    """The trace's signature groups and all its op tables."""
    groups = signature_groups(trace)
    nesting = _Nesting(trace, trace.op_parents, groups)
    perf, rows_by_calls = perf_groups(trace, groups, nesting)
    # TraceLens's kernel launchers (ops_summary, by category, unique args) count no NCCL/RCCL kernel
    launchers = signature_groups(trace, collectives=False) if any(
        category(name) == "communication" for name in set(map(_NAME, trace.gpu))) else groups
    return groups, ops_tables(launchers, perf, sheet_groups(trace, nesting, rows_by_calls, idle_calls), arch)
