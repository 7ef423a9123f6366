"""q8 moments of DTensor parameters (docs/distributed.md, "q8 moments"), on CPU ranks over gloo.

Every sharded run is compared with the unsharded single-process run of the same steps on the
same backend, bitwise: parameters, codes, scales, step counts and the skip decision. Every
placement runs on the reference backend; the whole-block ones (no shard cuts a q8 block) on the
C++ cpu engine too; and under backend auto, which steps cut blocks on the reference backend and
whole blocks (and unsharded tensors) on the cpu engine. The shapes put shard boundaries
inside q8 blocks of 256 elements (a 1-D parameter of 5000 elements on dim 0; Shard(1) of rows of
130, 600 and 1200 elements; Shard(2) of a 3-D tensor), where each block's scale is the MAX over
its ranks of their pieces' largest values, and whole-row shards (Shard(0) of 2-D and 3-D
parameters, uneven, one of them empty on a rank, on 1-D and 2x2 meshes), whose scales are
sharded alike (with clip on, as for every state dtype, the parameters only to the last bit of
the clip threshold). Four ranks: a 1-D mesh of 4 and 2x2 meshes, FSDP2 over tensor parallelism,
and a DCP checkpoint of a 2x2 run saved, resumed and (on two ranks, another mesh) resharded. Two
ranks: a 1-D mesh of 2, FSDP2's fully_shard, conversion of float moments into q8 and back, the
step inside backward under FSDP2, the eligibility rule on every rank, and the refusal of a
backend that cannot reduce the blocks."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from conftest import CPU_BACKENDS, bits, dtensor_api, has, require, spawn_ranks

require("gloo")
import torch.distributed as dist  # noqa: E402

STEPS = 4
SHAPES = {
    "vec": (5000,),  # 1-D: dim-0 shards cut blocks (on 2 ranks at 2500, inside block 9)
    "mat": (41, 130),  # one short block a row; uneven rows on 2 and 4 ranks
    "wide": (9, 600),  # three blocks a row (256, 256, 88): Shard(1) cuts the middle one
    "cube": (5, 30, 40),  # rows of 1200 (five blocks): Shard(1) and Shard(2) cut them
    "row": (1, 5000),  # one row: dim-0 shards leave every rank but one empty
}
# where each config plants its non-finite gradient (flat index): in a block a boundary cuts
BAD_AT = {"vec": 2400, "mat": 7 * 130 + 3, "wide": 4 * 600 + 280, "cube": 2 * 1200 + 620,
          "row": 2400}
CONFIGS = {
    # a NaN at step 2 skips the step on every rank
    "skip": dict(dtype=torch.float32, bad=(2, math.nan),
                 cfg=dict(clip=0.0, weight_decay=0.1)),
    # an inf at step 1 makes its block's scale NaN on every rank that holds a piece of it
    "propagate": dict(dtype=torch.float32, bad=(1, math.inf),
                      cfg=dict(clip=0.0, nonfinite="propagate")),
    # S summed over shards (the threshold may move in its last float32 bit), bf16 parameters
    # rounded stochastically, bound "rel" (p_init): the moments stay bitwise
    "bf16-clip": dict(dtype=torch.bfloat16, bad=(2, math.nan),
                      cfg=dict(clip=1.0, bound_mode="rel", bound=0.5)),
}
# placement (one name a mesh dim) -> the shapes it is run on, each under every config
PLACEMENTS_2 = {  # mesh (2,)
    ("S0",): ("vec", "mat", "wide", "cube", "row"), ("S1",): ("mat", "wide", "cube", "row"),
    ("S2",): ("cube",), ("R",): ("wide",)}
PLACEMENTS_4 = {("S0",): ("vec", "mat", "row"), ("S1",): ("wide", "cube")}  # mesh (4,)
PLACEMENTS_2x2 = {  # mesh (2, 2): FSDP2 over TP's Shard(1), HSDP, the reverse order, and
    # whole rows on both mesh dims (rows sharded twice; rows replicated on the second)
    ("S0", "S1"): ("mat", "wide", "cube"), ("R", "S0"): ("vec", "row"),
    ("S1", "S0"): ("wide", "cube"), ("S0", "S0"): ("cube",), ("S0", "R"): ("mat",)}


def _placements(names):
    _, Shard, Replicate, _ = dtensor_api()
    return [Replicate() if n == "R" else Shard(int(n[1:])) for n in names]


def _data(shape_name, cname):
    shape, c = SHAPES[shape_name], CONFIGS[cname]
    gen = torch.Generator().manual_seed(sum(shape))
    init = torch.randn(shape, generator=gen).to(c["dtype"])
    grads = [(torch.randn(shape, generator=gen) * 0.1).to(c["dtype"]) for _ in range(STEPS)]
    step, value = c["bad"]
    grads[step].view(-1)[BAD_AT[shape_name]] = value
    return init, grads


def _whole(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _run(make, shape_name, cname, backend):
    """The results of STEPS steps of the parameter ``make(tensor)`` wraps (whole tensors) on
    ``backend``."""
    from luminamoon import LuminaMoon

    init, grads = _data(shape_name, cname)
    p = torch.nn.Parameter(make(init.clone()))
    opt = LuminaMoon([p], lr=2e-2, seed=77, state_dtype="q8", backend=backend,
                     **CONFIGS[cname]["cfg"])
    for g in grads:
        p.grad = make(g.clone())
        opt.step()
    from luminamoon.optimizer._q8_state import whole_blocks

    out = {"p": _whole(p.detach()), "skipped": int(opt.skipped_steps),
           "backends": sorted(b.name for b in opt._plan.backends),
           "whole blocks": [whole_blocks(g) for g in opt._plan.groups]}
    for key, value in opt.state[p].items():
        out[key] = int(value) if key == "step" else _whole(value)
    return out


def _whole_placement(names, shape_name) -> bool:
    """The statement of the rule the backends consult (``_q8_state.whole_blocks``): no block is
    cut on a mesh dim that replicates the parameter or shards dim 0 of a tensor of two or more
    dims."""
    return all(n == "R" or (n == "S0" and len(SHAPES[shape_name]) >= 2) for n in names)


AUTO_CONFIG = "skip"  # the config the auto runs take


def _auto_cases(placements):
    """(placement, shape) pairs run under backend auto: the first shape of each placement whose
    blocks are cut, and the first whose blocks are whole."""
    seen, out = set(), []
    for names, shapes in placements.items():
        for shape_name in shapes:
            key = (names, _whole_placement(names, shape_name))
            if key not in seen:
                seen.add(key)
                out.append(("-".join(names), shape_name))
    return out


def _placement_runs(mesh, placements):
    """Every case on the reference backend; the whole-block ones on the cpu engine too (where
    the compiled module imports); the pairs of :func:`_auto_cases` under backend auto."""
    from conftest import native_available

    _, _, _, distribute_tensor = dtensor_api()
    out = {"reference": {}, "cpu": {}, "auto": {}}
    auto = _auto_cases(placements)
    for pname, shape_name, cname in _cases(placements):
        names = pname.split("-")
        pl = _placements(names)
        make = lambda t: distribute_tensor(t, mesh, pl)  # noqa: E731
        case = (pname, shape_name, cname)
        out["reference"][case] = _run(make, shape_name, cname, "reference")
        if native_available() and _whole_placement(names, shape_name):
            out["cpu"][case] = _run(make, shape_name, cname, "cpu")
        if cname == AUTO_CONFIG and (pname, shape_name) in auto:
            out["auto"][(pname, shape_name)] = _run(make, shape_name, cname, "auto")
    return out


# ---------------------------------------------------------------------------------------------
# DCP: a model of three q8 parameters, two of them with cut blocks
# ---------------------------------------------------------------------------------------------
DCP_SHAPES = {"w": (41, 130), "b": (5000,), "c": (24, 300)}
DCP_PLACEMENTS_4 = {"w": ("S0", "S1"), "b": ("R", "S0"), "c": ("S0", "R")}  # mesh (2, 2)
DCP_PLACEMENTS_2 = {"w": ("S1",), "b": ("S0",), "c": ("S0",)}  # mesh (2,)
DCP_HYPER = dict(lr=2e-2, clip=0.0, bound_mode="abs", bound=0.3, state_dtype="q8", seed=4321)
SAVE_AFTER = 2


class _Model(torch.nn.Module):
    def __init__(self, init):
        super().__init__()
        for name, value in init.items():
            setattr(self, name, torch.nn.Parameter(value.clone()))


def _dcp_data():
    gen = torch.Generator().manual_seed(21)
    init = {n: torch.randn(s, generator=gen) for n, s in DCP_SHAPES.items()}
    grads = [{n: torch.randn(s, generator=gen) * 0.1 for n, s in DCP_SHAPES.items()}
             for _ in range(STEPS)]
    grads[1]["w"][40, 129] = math.nan  # the second step is skipped, before the save
    return init, grads


def _dcp_model(init, mesh, placements):
    _, _, _, distribute_tensor = dtensor_api()
    model = _Model(init)
    if mesh is not None:
        for name, names in placements.items():
            p = getattr(model, name)
            setattr(model, name, torch.nn.Parameter(
                distribute_tensor(p.detach(), mesh, _placements(names))))
    return model


def _dcp_steps(model, opt, grads, mesh=None, placements=None):
    _, _, _, distribute_tensor = dtensor_api()
    for g in grads:
        for name, p in model.named_parameters():
            full = g[name].clone()
            p.grad = full if mesh is None else distribute_tensor(full, mesh,
                                                                 _placements(placements[name]))
        opt.step()


def _dcp_full(model, opt):
    out = {"skipped": int(opt.skipped_steps), "seed": opt.param_groups[0]["seed"]}
    for name, p in model.named_parameters():
        out[name] = _whole(p.detach()).clone()
        for key, value in opt.state[p].items():
            out[f"{name}.{key}"] = int(value) if key == "step" else _whole(value).clone()
    return out


def _dcp_load(model, opt, ckpt):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)

    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, optim_state_dict=state["optim"])


def _dcp_save_and_resume(mesh, ckpt):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict,
                                                         get_optimizer_state_dict)

    from luminamoon import LuminaMoon

    init, grads = _dcp_data()
    model = _dcp_model(init, mesh, DCP_PLACEMENTS_4)
    opt = LuminaMoon(model.parameters(), **DCP_HYPER)
    _dcp_steps(model, opt, grads[:SAVE_AFTER], mesh, DCP_PLACEMENTS_4)
    dcp.save({"model": get_model_state_dict(model),
              "optim": get_optimizer_state_dict(model, opt)}, checkpoint_id=ckpt)
    _dcp_steps(model, opt, grads[SAVE_AFTER:], mesh, DCP_PLACEMENTS_4)
    straight = _dcp_full(model, opt)
    zeros = {n: torch.zeros_like(t) for n, t in init.items()}
    model2 = _dcp_model(zeros, mesh, DCP_PLACEMENTS_4)
    opt2 = LuminaMoon(model2.parameters(), **{**DCP_HYPER, "seed": 99})
    _dcp_load(model2, opt2, ckpt)
    placed = {name: (tuple(opt2.state[p]["exp_avg"].placements),
                     tuple(opt2.state[p]["exp_avg_scale"].placements))
              for name, p in model2.named_parameters()}
    _dcp_steps(model2, opt2, grads[SAVE_AFTER:], mesh, DCP_PLACEMENTS_4)
    return {"straight": straight, "resumed": _dcp_full(model2, opt2), "placed": placed}


def _dcp_reshard(mesh, ckpt):
    from luminamoon import LuminaMoon

    init, grads = _dcp_data()
    zeros = {n: torch.zeros_like(t) for n, t in init.items()}
    model = _dcp_model(zeros, mesh, DCP_PLACEMENTS_2)
    opt = LuminaMoon(model.parameters(), **{**DCP_HYPER, "seed": 5})
    _dcp_load(model, opt, ckpt)
    _dcp_steps(model, opt, grads[SAVE_AFTER:], mesh, DCP_PLACEMENTS_2)
    return _dcp_full(model, opt)


# ---------------------------------------------------------------------------------------------
# two ranks: eligibility, conversion, refusal, FSDP2
# ---------------------------------------------------------------------------------------------
ELIGIBILITY = {  # name: (global shape, placement, q8 by the rule)
    "below-1d": ((4095,), "S0", False), "at-1d": ((4096,), "S0", True),
    "empty-on-a-rank": ((1, 5000), "S0", True), "below-2d": ((63, 65), "S1", False),
    "at-2d": ((64, 64), "S1", True), "replicated": ((4100,), "R", True),
}


def _eligibility(mesh):
    from luminamoon import LuminaMoon

    _, _, _, distribute_tensor = dtensor_api()
    params = [torch.nn.Parameter(distribute_tensor(torch.ones(shape), mesh, _placements([pl])))
              for shape, pl, _ in ELIGIBILITY.values()]
    for p, (shape, pl, _) in zip(params, ELIGIBILITY.values()):
        p.grad = distribute_tensor(torch.full(shape, 0.5), mesh, _placements([pl]))
    opt = LuminaMoon(params, state_dtype="q8", seed=1)
    opt.step()
    mine = {name: (str(opt.state[p]["exp_avg"].dtype), tuple(opt.state[p]["exp_avg"].shape),
                   tuple(opt.state[p]["exp_avg"].to_local().shape))
            for name, p in zip(ELIGIBILITY, params)}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def _conversion(mesh):
    """Float32 moments of DTensor parameters into a q8 optimizer and back, and the same on
    plain tensors: whole tensors of both."""
    from luminamoon import LuminaMoon

    _, _, _, distribute_tensor = dtensor_api()
    names = {"vec": "S0", "wide": "S1", "mat": "S0"}
    out = {}
    for sharded in (True, False):
        params, grads = [], []
        for shape_name, pl in names.items():
            init, g = _data(shape_name, "skip")
            make = ((lambda t, pl=pl: distribute_tensor(t, mesh, _placements([pl])))
                    if sharded else (lambda t: t))
            params.append(torch.nn.Parameter(make(init.clone())))
            grads.append([make(x.clone()) for x in g[:2]])
        opt_f = LuminaMoon(params, lr=1e-2, seed=3, clip=0.0)
        for step in range(2):
            for p, g in zip(params, grads):
                p.grad = g[step]
            opt_f.step()
        opt_q = LuminaMoon(params, lr=1e-2, seed=3, clip=0.0, state_dtype="q8")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opt_q.load_state_dict(opt_f.state_dict())
        to_q8 = [str(w.message) for w in seen]
        opt_back = LuminaMoon(params, lr=1e-2, seed=3, clip=0.0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            opt_back.load_state_dict(opt_q.state_dict())
        if sharded:  # q8 state whose DTensors were redistributed (same mesh): placed back
            replicated = opt_q.state_dict()  # (its per-parameter dicts are opt_q's own)
            replicated["state"] = {
                i: {k: (v if k == "step" else v.redistribute(mesh, _placements(["R"])))
                    for k, v in values.items()} for i, values in replicated["state"].items()}
            opt_r = LuminaMoon(params, lr=1e-2, seed=3, clip=0.0, state_dtype="q8")
            opt_r.load_state_dict(replicated)
            redistributed = [
                all(torch.equal(opt_r.state[p][k].to_local(), opt_q.state[p][k].to_local())
                    and opt_r.state[p][k].placements == opt_q.state[p][k].placements
                    for k in opt_q.state[p] if k != "step") for p in params]
        out[sharded] = {
            "redistributed": redistributed if sharded else None, "to_q8": to_q8, "back": [str(w.message) for w in seen],
            "float": [{k: _whole(v) for k, v in opt_f.state[p].items() if k != "step"}
                      for p in params],
            "q8": [{k: _whole(v) for k, v in opt_q.state[p].items() if k != "step"}
                   for p in params],
            "decoded": [{k: _whole(v) for k, v in opt_back.state[p].items() if k != "step"}
                        for p in params]}
    return out


def _refusal(mesh):
    """An explicit backend without the block reduction, on a parameter whose blocks its shard
    boundaries cut: refused by name, nothing changed."""
    from luminamoon import LuminaMoon

    _, _, _, distribute_tensor = dtensor_api()
    p = torch.nn.Parameter(distribute_tensor(torch.ones(9, 600), mesh, _placements(["S1"])))
    p.grad = distribute_tensor(torch.full((9, 600), 0.5), mesh, _placements(["S1"]))
    before = p.detach().to_local().clone()
    try:
        opt = LuminaMoon([p], state_dtype="q8", seed=1, backend="cpu")
    except ImportError as exc:
        return {"message": None, "why": str(exc)}
    try:
        opt.step()
        message = None
    except ValueError as exc:
        message = str(exc)
    return {"message": message, "unchanged": torch.equal(before, p.detach().to_local()),
            "no state": not opt.state[p]}


FSDP_STEPS = 3


class _Small(torch.nn.Module):
    """A weight of 65 x 80 (whole rows on each rank, 33 and 32 of them: FSDP2's uneven chunks,
    its scales chunked alike), a 1-D gain of 4160 (its dim-0 shards cut block 8), and small
    float32-moment tensors."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(80, 65)
        self.gain = torch.nn.Parameter(1 + 0.1 * torch.randn(4160))
        self.out = torch.nn.Linear(65, 3)

    def forward(self, x):
        h = torch.tanh(self.lin(x)) * self.gain.view(64, 65).mean(0)
        return self.out(h)


FSDP_HYPER = dict(lr=1e-2, clip=0.0, state_dtype="q8", seed=8, backend="reference")


def _fsdp(mesh):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from luminamoon import LuminaMoon

    from luminamoon import step_in_backward

    def wrap(model):
        fully_shard(model.lin, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    model, hooked = wrap(_Small()), wrap(_Small())
    opt = LuminaMoon(model.parameters(), **FSDP_HYPER)
    # the step inside backward, one parameter a bucket: each bucket's MAX all-reduce in the
    # order FSDP2 finishes the gradients, alike on both ranks
    in_backward = step_in_backward(hooked, bucket_bytes=0, **FSDP_HYPER)
    grads = []
    for step in range(FSDP_STEPS):
        opt.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(100 * step + dist.get_rank())
        x = torch.randn(6, 80, generator=gen)
        model(x).square().mean().backward()
        grads.append([_whole(p.grad).clone() for p in model.parameters()])
        opt.step()
        hooked(x).square().mean().backward()
    in_backward_same = [torch.equal(bits(_whole(a.detach())), bits(_whole(b.detach())))
                        for a, b in zip(model.parameters(), hooked.parameters())]
    in_backward_same.append(int(in_backward.skipped_steps) == 0)
    return {"grads": grads, "params": [_whole(p.detach()) for p in model.parameters()],
            "in backward": in_backward_same,
            "state": [{k: (int(v) if k == "step" else _whole(v)) for k, v in opt.state[p].items()}
                      for p in model.parameters()],
            "placements": [tuple(p.placements) for p in model.parameters()]}


class _Mlp(torch.nn.Module):
    """FSDP2 over tensor parallelism: fc Colwise (its weight (_StridedShard(0), Shard(0)):
    whole rows, scales placed alike), out Rowwise (its weight (Shard(0), Shard(1)): cut
    blocks); widths even over the ranks (docs/distributed.md, "Limits")."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.fc = torch.nn.Linear(64, 128)
        self.out = torch.nn.Linear(128, 40)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(x)))


def _fsdp_tp():
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    from luminamoon import LuminaMoon

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _Mlp()
    parallelize_module(model, mesh["tp"], {"fc": ColwiseParallel(), "out": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = LuminaMoon(model.parameters(), **FSDP_HYPER)
    grads = []
    for step in range(FSDP_STEPS):
        opt.zero_grad(set_to_none=True)
        gen = torch.Generator().manual_seed(10 * step + mesh["dp"].get_local_rank())
        model(torch.randn(6, 64, generator=gen)).square().mean().backward()
        grads.append([_whole(p.grad).clone() for p in model.parameters()])
        opt.step()
    return {"grads": grads, "params": [_whole(p.detach()) for p in model.parameters()],
            "state": [{k: (int(v) if k == "step" else _whole(v)) for k, v in opt.state[p].items()}
                      for p in model.parameters()],
            "placements": [str(tuple(p.placements)) for p in model.parameters()],
            "scale placements": [str(tuple(opt.state[p]["exp_avg_scale"].placements))
                                 for p in (model.fc.weight, model.out.weight)]}


# ---------------------------------------------------------------------------------------------
# the two launches
# ---------------------------------------------------------------------------------------------
def _four(rank, ckpt, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    out = {"1d": _placement_runs(init_device_mesh("cpu", (4,)), PLACEMENTS_4)}
    mesh = init_device_mesh("cpu", (2, 2))
    out["2d"] = _placement_runs(mesh, PLACEMENTS_2x2)
    out["dcp"] = _dcp_save_and_resume(mesh, ckpt)
    if has("tensor parallel", "fsdp2"):
        out["fsdp-tp"] = _fsdp_tp()
    if rank == 0:
        torch.save(out, out_path)


def _two(rank, ckpt, out_path):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    out = {"1d": _placement_runs(mesh, PLACEMENTS_2), "eligibility": _eligibility(mesh),
           "conversion": _conversion(mesh), "refusal": _refusal(mesh),
           "reshard": _dcp_reshard(mesh, ckpt)}
    if has("fsdp2"):
        out["fsdp"] = _fsdp(mesh)
    if rank == 0:
        torch.save(out, out_path)


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    require("distributed checkpoint")
    tmp = tmp_path_factory.mktemp("q8")
    ckpt = str(tmp / "ckpt")
    (tmp / "s4").mkdir()
    (tmp / "s2").mkdir()
    spawn_ranks(_four, 4, str(tmp / "s4"), ckpt, str(tmp / "four.pt"))
    spawn_ranks(_two, 2, str(tmp / "s2"), ckpt, str(tmp / "two.pt"))
    return torch.load(tmp / "four.pt"), torch.load(tmp / "two.pt")


_PLAIN = {}


def _plain(shape_name, cname, backend):
    key = (shape_name, cname, backend)
    if key not in _PLAIN:
        _PLAIN[key] = _run(lambda t: t, shape_name, cname, backend)
    return _PLAIN[key]


def _assert_same(got, want, keys=None):
    assert sorted(got) == sorted(want)
    for key in keys or want:
        if isinstance(want[key], torch.Tensor):
            assert got[key].dtype == want[key].dtype, key
            assert torch.equal(bits(got[key]), bits(want[key])), key
        else:
            assert got[key] == want[key], key


def _check_run(got, want, case, backend):
    """The sharded run ``got`` of ``case`` against the unsharded run ``want``, both on
    ``backend``."""
    pname, shape_name, cname = case
    assert got["backends"] == want["backends"] == [backend]
    assert "exp_avg_scale" in want and want["exp_avg"].dtype == torch.uint8
    assert want["whole blocks"] == [True]
    assert got["whole blocks"] == [_whole_placement(pname.split("-"), shape_name)], case
    got = {k: v for k, v in got.items() if k != "whole blocks"}
    want = {k: v for k, v in want.items() if k != "whole blocks"}
    if cname == "propagate":
        assert want["skipped"] == 0 and bool(torch.isnan(want["exp_avg_scale"]).any())
    else:
        assert want["skipped"] == 1 and want["step"] == STEPS - 1
    if CONFIGS[cname]["cfg"]["clip"] == 0:
        _assert_same(got, want)
        return
    # S is a sum of per-shard sums: the params may move where q sits at a rounding edge; the
    # moments do not depend on S
    _assert_same(got, want, [k for k in want if k != "p"])
    diff = got["p"].double() - want["p"].double()
    assert int((diff != 0).sum()) <= max(2, want["p"].numel() // 50)
    assert bool((diff.abs() <= want["p"].double().abs() * 2.0**-7 + 1e-30).all())


def _cases(placements):
    return [("-".join(names), shape_name, cname) for names, shapes in placements.items()
            for shape_name in shapes for cname in CONFIGS]


def _whole_cases(placements):
    return [c for c in _cases(placements) if _whole_placement(c[0].split("-"), c[1])]


# (launch index, key of its placement runs) of each placement table
_LAUNCH = {"2": (1, "1d"), "4": (0, "1d"), "2x2": (0, "2d")}
_TABLES = {"2": PLACEMENTS_2, "4": PLACEMENTS_4, "2x2": PLACEMENTS_2x2}


def _launched(launches, mesh, backend):
    index, key = _LAUNCH[mesh]
    return launches[index][key][backend]


def _need_cpu_engine():
    if "cpu" not in CPU_BACKENDS:
        require("native")
    assert "cpu" in CPU_BACKENDS, "the compiled module luminamoon._luminav does not import"


@pytest.mark.parametrize("case", _cases(PLACEMENTS_2), ids="-".join)
def test_two_ranks_1d_mesh_equals_unsharded(case, launches):
    _check_run(_launched(launches, "2", "reference")[case], _plain(*case[1:], "reference"),
               case, "reference")


@pytest.mark.parametrize("case", _cases(PLACEMENTS_4), ids="-".join)
def test_four_ranks_1d_mesh_equals_unsharded(case, launches):
    _check_run(_launched(launches, "4", "reference")[case], _plain(*case[1:], "reference"),
               case, "reference")


@pytest.mark.parametrize("case", _cases(PLACEMENTS_2x2), ids="-".join)
def test_2x2_mesh_equals_unsharded(case, launches):
    _check_run(_launched(launches, "2x2", "reference")[case], _plain(*case[1:], "reference"),
               case, "reference")


@pytest.mark.parametrize("mesh,case", [(m, c) for m, table in _TABLES.items()
                                       for c in _whole_cases(table)],
                         ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_cpu_engine_whole_block_shards_equal_its_unsharded_run(mesh, case, launches):
    """The C++ engine stepping the local codes and scales of whole-block shards: bitwise its
    own unsharded run."""
    _need_cpu_engine()
    got = _launched(launches, mesh, "cpu")
    assert sorted(got) == sorted(_whole_cases(_TABLES[mesh]))
    _check_run(got[case], _plain(*case[1:], "cpu"), case, "cpu")


@pytest.mark.parametrize("mesh,pname,shape_name", [
    (m, pname, shape_name) for m, table in _TABLES.items()
    for pname, shape_name in _auto_cases(table)])
def test_auto_steps_cut_blocks_on_reference_and_whole_blocks_on_the_cpu_engine(
        mesh, pname, shape_name, launches):
    _need_cpu_engine()
    whole = _whole_placement(pname.split("-"), shape_name)
    picked = "cpu" if whole else "reference"
    runs = _launched(launches, mesh, "auto")
    assert sorted(runs) == sorted(_auto_cases(_TABLES[mesh]))
    got = runs[(pname, shape_name)]
    assert got["backends"] == [picked], (pname, shape_name)
    assert got["whole blocks"] == [whole]
    # the very run of the backend it picked, bit for bit
    want = _launched(launches, mesh, picked)[(pname, shape_name, AUTO_CONFIG)]
    _assert_same(got, want)


def test_auto_steps_an_unsharded_q8_tensor_on_the_cpu_engine():
    _need_cpu_engine()
    for shape_name in ("vec", "wide"):
        got = _plain(shape_name, AUTO_CONFIG, "auto")
        assert got["backends"] == ["cpu"]
        _assert_same(got, _plain(shape_name, AUTO_CONFIG, "cpu"))


def test_dcp_resume_on_the_same_mesh_is_bitwise(launches):
    dcp_run = launches[0]["dcp"]
    _assert_same(dcp_run["resumed"], dcp_run["straight"])
    Shard, Replicate = dtensor_api()[1:3]
    assert dcp_run["placed"]["w"] == ((Shard(0), Shard(1)), (Shard(0), Replicate()))
    assert dcp_run["placed"]["b"] == ((Replicate(), Shard(0)), (Replicate(), Replicate()))
    assert dcp_run["placed"]["c"] == ((Shard(0), Replicate()), (Shard(0), Replicate()))


def _dcp_plain():
    from luminamoon import LuminaMoon

    init, grads = _dcp_data()
    model = _dcp_model(init, None, None)
    opt = LuminaMoon(model.parameters(), **DCP_HYPER)
    _dcp_steps(model, opt, grads)
    return _dcp_full(model, opt)


def test_dcp_2x2_run_is_the_unsharded_run(launches):
    want = _dcp_plain()
    assert want["skipped"] == 1 and want["w.step"] == STEPS - 1
    assert want["b.exp_avg"].dtype == torch.uint8
    _assert_same(launches[0]["dcp"]["straight"], want)


def test_dcp_saved_on_2x2_loads_on_2_ranks_and_continues_bitwise(launches):
    _assert_same(launches[1]["reshard"], _dcp_plain())


def test_eligibility_is_decided_alike_on_every_rank(launches):
    every = launches[1]["eligibility"]
    decided = [{name: got[:2] for name, got in rank.items()} for rank in every]
    assert decided[0] == decided[1]  # (dtype, global shape) alike; the local shapes differ
    for name, (shape, _, q8) in ELIGIBILITY.items():
        dtype, global_shape, _ = every[0][name]
        assert dtype == ("torch.uint8" if q8 else "torch.float32"), name
        assert global_shape == shape
    # the (1, 5000) parameter is q8 on the rank that holds none of it, too
    assert every[1]["empty-on-a-rank"][2] == (0, 5000)


def test_conversion_both_ways_warns_and_equals_the_unsharded_conversion(launches):
    conv = launches[1]["conversion"]
    sharded, plain = conv[True], conv[False]
    for got in (sharded, plain):
        assert any("3 parameter(s) as float32" in m and "as q8" in m for m in got["to_q8"])
        assert any("as q8" in m and "keeps them as float32" in m for m in got["back"])
    for kind in ("q8", "decoded"):
        for got, want in zip(sharded[kind], plain[kind]):
            _assert_same(got, want)
    for state in sharded["q8"]:
        assert state["exp_avg"].dtype == torch.uint8
    assert sharded["redistributed"] == [True, True, True]
    # the decoded moments are near the float ones (nearest codes), not equal
    for dec, floats in zip(sharded["decoded"], sharded["float"]):
        assert dec["exp_avg"].dtype == torch.float32
        assert not torch.equal(dec["exp_avg"], floats["exp_avg"])
        err = (dec["exp_avg"] - floats["exp_avg"]).abs().max()
        assert float(err) <= 0.03 * float(floats["exp_avg"].abs().max())


def test_explicit_backend_without_the_block_reduction_refuses_by_name(launches):
    got = launches[1]["refusal"]
    if got["message"] is None and "why" in got:
        require("native")
    assert got["message"] is not None and "cut a block" in got["message"]
    assert "backend='auto' or 'reference'" in got["message"]
    assert got["unchanged"] and got["no state"]


def test_fsdp2_fully_shard_and_its_step_in_backward_equal_the_unsharded_replay(launches):
    require("fsdp2")
    recorded = launches[1]["fsdp"]
    assert all(pl == (dtensor_api()[1](0),) for pl in recorded["placements"])
    assert len(recorded["in backward"]) == 6 and all(recorded["in backward"])
    model, opt = _replay(_Small, recorded)
    kinds = {n: opt.state[p]["exp_avg"].dtype for n, p in model.named_parameters()}
    assert kinds["lin.weight"] == kinds["gain"] == torch.uint8
    assert kinds["lin.bias"] == torch.float32


def _replay(make, recorded):
    from luminamoon import LuminaMoon

    model = make()
    opt = LuminaMoon(model.parameters(), **FSDP_HYPER)
    for grads in recorded["grads"]:
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        opt.step()
    for got, p in zip(recorded["params"], model.parameters()):
        assert torch.equal(bits(got), bits(p.detach()))
    for got, p in zip(recorded["state"], model.parameters()):
        _assert_same(got, {k: (int(v) if k == "step" else v) for k, v in opt.state[p].items()})
    return model, opt


def test_fsdp2_over_tensor_parallel_equals_the_unsharded_replay(launches):
    require("tensor parallel", "fsdp2")
    recorded = launches[0]["fsdp-tp"]
    assert recorded["placements"][0] == "(_StridedShard(dim=0, sf=2), Shard(dim=0))"
    assert recorded["scale placements"] == [recorded["placements"][0],
                                            "(Shard(dim=0), Replicate())"]
    model, opt = _replay(_Mlp, recorded)
    assert opt.state[model.out.weight]["exp_avg"].dtype == torch.uint8
