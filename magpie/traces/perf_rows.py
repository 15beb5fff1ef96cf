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

from itertools import chain, compress, groupby, repeat
from operator import attrgetter, gt, is_not, itemgetter

import msgspec

from magpie.traces.ingest import Trace
from magpie.traces.kernels import category, gemm_transposes
from magpie.traces.ops_tables import (
    SYNTHETIC,
    SignatureGroup,
    busy_time,
    grouped_calls,
    held_group,
    launcher_of,
    op_category,
    ops_tables,
    trace_calls,
    where_of,
)
from magpie.traces.perf_models import TRACELENS_MODELS, Estimate, estimate, models_whole_op


class _Nesting:
    """The trace's ops as the perf rows need them: each launching op's signature group and
    launches; which launching ops are not plain (`complex`), and around them (the region) the op
    tree with the GPU work under each op; the signature groups with such a call (`mixed`)."""

    def __init__(
        self,
        trace: Trace,
        parents: dict[int, int],
        groups: list[SignatureGroup],
        whole: _Nesting | None = None,
        holds=None,
        ops_of: dict[int, list[int]] | None = None,
    ):
        """With `whole` (the trace's), `holds` (whether a stage holds an op's GPU work, none cut)
        and `ops_of`, a stage view's: its launching ops are the trace's in its steps, each with
        the very ops around and inside it, so the trace's region is the stage's in its steps."""
        self.trace, self.parents = trace, parents
        self.by_id = {id(group): group for group in groups if group.op is not None}
        if whole is None:
            # a call of an op's signature group is one op's launches (a million events hold some 10^5
            # of them: filled by dict and zip, not one Python step each)
            self.launches: dict[int, list] = {}
            self.ops_of: dict[int, list[int]] = {}  # id(signature group) -> its ops, in call order
            for group in groups:
                if group.op is not None:
                    members = self.ops_of[id(group)] = list(map(_OP, map(_FIRST, group.calls)))
                    self.launches.update(zip(members, group.calls))
            self._region(parents)
            # the rows and the sheets ask for the same ops: each answer is kept
            self.subtrees: dict[int, list] = {}
            self.signatures: dict[int, tuple[bytes, Estimate | None]] = {}
            self.estimates: dict[bytes, Estimate | None] = {}
            self.places: dict[tuple, tuple] = {}
        else:
            self.ops_of = ops_of
            self.complex = set(filter(holds, whole.complex))
            self.busy = set(filter(holds, whole.busy))
            self.roots = list(filter(holds, whole.roots))
            # asked only of the stage's ops, whose answers are the trace's
            self.launches, self.children, self.modelled, self.modelled_below = (
                whole.launches,
                whole.children,
                whole.modelled,
                whole.modelled_below,
            )
            self.subtrees, self.signatures, self.estimates, self.places = (
                whole.subtrees,
                whole.signatures,
                whole.estimates,
                whole.places,
            )
        # the signature groups with a call that is not plain (id -> group)
        self.mixed = {
            group_id: self.by_id[group_id]
            for group_id, members in self.ops_of.items()
            if not self.complex.isdisjoint(members)
        }

    def _region(self, parents: dict[int, int]) -> None:
        """The launching ops that are not plain, and the op tree around them."""
        ops = self.trace.cpu_ops
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


def perf_groups(
    trace: Trace, groups: list[SignatureGroup], nesting: _Nesting
) -> tuple[list[SignatureGroup], dict[tuple, SignatureGroup]]:
    """The unified rows' groups (calls of one op and signature, or one synthetic op), most GPU
    time first, ties to the first called, and those of ops by the calls they hold (op indices,
    ascending); `groups` are the trace's signature groups: their launches outside any op are
    TraceLens's synthetic ops as they stand, and one whose calls are all plain is its row's."""
    ops, uids = trace.cpu_ops, trace.op_uids
    row_ops, through = nesting.walk()
    # a mixed group's plain calls are rows of their own signature too
    others = row_ops + [
        op for group_id in nesting.mixed for op in nesting.ops_of[group_id] if op not in nesting.complex
    ]
    built: dict[tuple, list[int]] = {}
    for op in sorted(others, key=lambda op: ops[op].ts):
        if op in nesting.modelled or not _communicates(nesting.subtree(op)):
            built.setdefault((nesting.signature(op)[0], nesting.where(ops[op])), []).append(op)
    rows: list[SignatureGroup] = [g for g in groups if g.op is None and not _communicates(g.calls[0])]
    by_calls: dict[tuple, SignatureGroup] = {}
    for group in groups:
        # a signature's calls launch alike: its first call says whether it communicates
        if (
            group.op is None
            or id(group) in nesting.mixed
            or (not models_whole_op(group.name) and _communicates(group.calls[0]))
        ):
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
        group = SignatureGroup(
            first.name,
            first,
            est,
            op_category(first.name, own),
            first.name,
            where=where,
            uid=uids[members[0]],
            params=_params(est, nesting.transposes(members[0], est)) if est else {},
        )
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
                name, call, None, op_category(call.name, own), call.name, where=where, uid=synthetic_uid
            )
        synthetic_uid += 1
        _add_call(group, [activity], call.dur)
    return sorted([*rows, *synthetic.values()], key=lambda g: (-g.total, g.uid)), by_calls


def sheet_groups(
    trace: Trace, nesting: _Nesting, rows_by_calls: dict[tuple, SignatureGroup], idle_calls: bool = True
) -> dict[str, list[SignatureGroup]]:
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
    unplaced: list[list[int]] = []  # the calls of the other signature groups of the ops TraceLens models
    for group_id, calls in nesting.ops_of.items():
        group = nesting.by_id[group_id]
        if group.name not in TRACELENS_MODELS:
            continue
        if group_id in nesting.mixed or group.est is None:
            unplaced.append(calls)
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
        candidates = set(chain.from_iterable(unplaced)) | {
            op for op in nesting.busy if ops[op].name in TRACELENS_MODELS
        }
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
            group = SignatureGroup(
                first.name,
                first,
                nesting.signature(calls[0])[1],
                "",
                first.name,
                where=nesting.where(first),
                uid=trace.op_uids[calls[0]],
                params=params_of[slot],
            )
            for op in calls:
                _add_call(group, nesting.subtree(op), ops[op].dur)
        sheets.setdefault(slot[0], []).append(group)
    return {sheet: sorted(found, key=lambda g: (-g.total, g.uid)) for sheet, found in sheets.items()}


class TraceCalls:
    """A trace's calls (ops_tables.trace_calls), those less its NCCL/RCCL kernels where it has
    any (TraceLens's kernel launchers), their signature groups and the op tree around them: what
    the op tables of the trace, and of each stage view of it (`stage`), are made of."""

    def __init__(
        self,
        trace: Trace,
        calls: list[tuple],
        launcher_calls: list[tuple] | None,
        groups: list[SignatureGroup] | None = None,
        nesting: _Nesting | None = None,
    ):
        self.trace, self.calls, self.launcher_calls = trace, calls, launcher_calls
        self.groups = groups if groups is not None else grouped_calls(trace, calls)
        self.nesting = nesting or _Nesting(trace, trace.op_parents, self.groups)
        # what stage() needs of the trace, found at its first stage (_for_stages): per call, what
        # a stage holds all or none of; each nested op's outermost op; the places (in `calls`) of
        # each op's signature group's calls (by id), of the calls outside any op and of those that
        # launched several activities
        self.tops: list | None = None
        self.top_of: dict[int, int] = {}
        self.members: dict[int, list[int]] = {}
        self.synthetic: list[int] = []
        self.several: list[int] = []

    @classmethod
    def of(cls, trace: Trace) -> TraceCalls:
        return cls(
            trace,
            trace_calls(trace),
            trace_calls(trace, collectives=False)
            if any(category(name) == "communication" for name in set(map(_NAME, trace.gpu)))
            else None,
        )

    def _for_stages(self) -> None:
        """Each nested op's outermost op, and per call what a stage must hold all or none of: its
        outermost op's calls (so that no op's subtree is cut), or outside any op, its launch's;
        the places of each op's signature group's calls, of those outside any op and of those
        that launched several activities."""
        parents, top_of = self.trace.op_parents, self.top_of
        launchers = list(map(_FIRST, self.calls))
        for launcher in filter(parents.__contains__, launchers):  # an op no op encloses is its own outermost
            if launcher in top_of:
                continue
            path, at = [], launcher
            while True:
                path.append(at)
                at = parents.get(at)
                if at is None:
                    top = path[-1]
                    break
                top = top_of.get(at)
                if top is not None:
                    break
            top_of.update(dict.fromkeys(path, top))
        self.synthetic = list(compress(range(len(launchers)), map(is_not, map(type, launchers), repeat(int))))
        self.several = list(compress(range(len(launchers)), map(gt, map(len, map(_LAUNCHED, self.calls)), repeat(1))))
        launches = {
            launchers[i]: ("launch", self.calls[i][1][0].launch)
            for i in self.synthetic
            if self.calls[i][1][0].launch is not None
        }
        self.tops = list(map(top_of.get, launchers, map(launches.get, launchers, launchers)))
        # the calls' places by signature, in C: a stable sort keeps each signature's in call order
        numbers = list(map(_NUMBER, self.calls))
        places = [
            list(run) for _, run in groupby(sorted(range(len(numbers)), key=numbers.__getitem__), numbers.__getitem__)
        ]
        first_calls = {id(self.calls[where[0]][1]): where for where in places}
        self.members = {id(group): first_calls[id(group.calls[0])] for group in self.groups if group.op is not None}

    def stage(self, view: Trace) -> TraceCalls:
        """A stage view's calls (its GPU activities some of the trace's): the trace's that fall
        in its steps, not walked again, where its steps cut no call (a graph launch's or an op's
        kernels some in, some out) and no op's subtree; their times, subtree times and order are
        then the view's own, and a group's first call is the first in the view. Else the view's,
        found anew."""
        if self.tops is None:  # once per trace, for all its stages
            self._for_stages()
        kept = set(map(id, view.gpu))
        held = list(map(kept.__contains__, map(id, map(_FIRST, map(_LAUNCHED, self.calls)))))
        top_held = dict(zip(self.tops, held))
        inside = list(compress(self.calls, held))
        # every outermost op's calls all in or all out, and every call wholly in or out: those
        # in hold all the view's activities (a call of one activity is in by its first) and no other
        if (
            list(map(top_held.__getitem__, self.tops)) != held
            or sum(map(len, map(_LAUNCHED, inside))) != len(kept)
            or not all(kept.issuperset(map(id, self.calls[i][1])) for i in self.several if held[i])
        ):
            return TraceCalls.of(view)
        groups, ops_of, first = [], {}, {}  # first: id(group) -> its first call's place in the trace's
        for whole in self.groups:
            if whole.op is not None:
                places = self.members[id(whole)]
                flags = list(map(held.__getitem__, places))
                if any(flags):
                    group = held_group(view, whole, flags)
                    groups.append(group)
                    ops_of[id(group)] = list(compress(self.nesting.ops_of[id(whole)], flags))
                    first[id(group)] = places[flags.index(True)]
        outside = [i for i in self.synthetic if held[i]]
        place = {self.calls[i][0]: i for i in outside}
        for group in grouped_calls(view, [self.calls[i] for i in outside]):
            groups.append(group)
            first[id(group)] = place[launcher_of(group.calls[0][0])]
        groups.sort(key=lambda g: (-g.total, first[id(g)]))  # grouped_calls's order: ties to the first called
        top_of = self.top_of
        nesting = _Nesting(
            view, self.trace.op_parents, groups, self.nesting, lambda op: top_held[top_of.get(op, op)], ops_of
        )
        launcher_calls = None
        if self.launcher_calls is not None and any(
            category(name) == "communication" for name in set(map(_NAME, view.gpu))
        ):
            launcher_calls = [call for call in self.launcher_calls if id(call[1][0]) in kept]
        return TraceCalls(view, inside, launcher_calls, groups, nesting)


_LAUNCHED, _NUMBER = itemgetter(1), itemgetter(4)


def trace_tables(
    trace: Trace, arch=None, idle_calls: bool = True, calls: TraceCalls | None = None
) -> tuple[list[SignatureGroup], dict[str, list[dict]]]:
    """The trace's signature groups and all its op tables, from its calls (TraceCalls) where
    they are known."""
    calls = calls or TraceCalls.of(trace)
    groups, nesting = calls.groups, calls.nesting
    perf, rows_by_calls = perf_groups(trace, groups, nesting)
    # TraceLens's kernel launchers (ops_summary, by category, unique args) count no NCCL/RCCL kernel
    launchers = grouped_calls(trace, calls.launcher_calls) if calls.launcher_calls is not None else groups
    return groups, ops_tables(launchers, perf, sheet_groups(trace, nesting, rows_by_calls, idle_calls), arch)
