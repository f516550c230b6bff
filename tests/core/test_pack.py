"""Tests of packs (`ablate.core.pack`): k configs trained as one batched model, each member as if it ran alone.

Tolerances. On the CPU a pack runs each member with its solo run's own kernel calls (``solo_kernels``, the
default there: :mod:`ablate.core.batched`), so every member must equal its solo Experiment bit for bit (float32),
at the small test shapes and at a laptop grid's; :func:`test_a_member_makes_its_solo_run_s_kernel_calls` checks
the mechanism itself (the same ``mm``/``addmm``/``softplus`` calls on operands of the same shapes, strides and
alignment), which does not depend on this machine's CPU. The batched path a GPU takes (``solo_kernels`` off) is
compared in float64 within 1e-10: a batched matmul may sum in another order than the solo one (float
reassociation); one ulp of float64 in every initial weight moved the weights by 4e-16 after 20 steps (float32:
5e-6), so 1e-10 keeps six orders of margin and still catches any real mix-up of members. Frozen and failed
members are compared bit for bit: nothing of theirs is computed any more. Small sizes (d = 4, B = 32, narrow
encoder) keep the file fast.
"""

from __future__ import annotations

import io
import math
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ablate.config import RunConfig
from ablate.core.batched import pack_loss
from ablate.core.experiment import Experiment
from ablate.core.pack import PackedExperiment, member_state
from ablate.core.pack_fields import MEMBER_FIELDS, SHAPE_FIELDS, can_pack, pack_groups, pack_signature
from ablate.service.specs.grids import load_grid

SMALL = {
    "latent_dim": 4,
    "batch_size": 32,
    "encoder_widths": [10, 10, 10],
    "eval_samples": 256,
    "lr": 1e-3,
    "lr_lambda": 1e-2,
    "device": "cpu",
    "generator_cond_samples": 1000,
}

#: Loss variants that must pack; each member of a pack of 3 gets its own seed, g, Λ or τ, and learning rates.
VARIANTS = {
    "aninfonce": {},
    "infonce": {"loss": "infonce"},
    "infonce_reference": {"loss": "infonce", "infonce_layout": "reference"},
    "hard_negatives": {"negative_concentration": 2.0, "n_hard_negatives": 2, "hard_negatives_from_step": 5},
    "fixed_lambda_hat": {"fixed_lambda_hat": 3.0},
}
MEMBERS = [
    {"seed": 0, "lr": 1e-3, "lr_lambda": 1e-2, "concentration": "5/25", "tau": 1.0, "fixed_lambda_hat": 3.0},
    {"seed": 1, "lr": 3e-3, "lr_lambda": 3e-2, "concentration": 10.0, "tau": 0.5, "fixed_lambda_hat": 8.0},
    {"seed": 2, "generator_seed": 7, "lr": 5e-4, "lr_lambda": 5e-3, "concentration": "25/5", "tau": 2.0,
     "fixed_lambda_hat": [1.0, 2.0, 3.0, 4.0]},
]  # fmt: skip
TOL = 1e-10


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def configs(variant: str, k: int = 3, **extra) -> list[RunConfig]:
    out = []
    for member in MEMBERS[:k]:
        settings = {**SMALL, **VARIANTS[variant], **member, **extra}
        if "fixed_lambda_hat" not in VARIANTS[variant]:
            settings.pop("fixed_lambda_hat")
        out.append(RunConfig.build(settings))
    return out


def tensors(state) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of a (nested) state, with its path."""
    if isinstance(state, torch.Tensor):
        return [("", state)]
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list | tuple) else []
    return [(f"{k}/{p}", t) for k, v in items for p, t in tensors(v)]


def assert_states(a: dict, b: dict, tol: float = 0.0) -> None:
    """Two Experiment states: the same structure and values; tensors equal (``tol`` 0) or within ``tol``."""
    ta, tb = tensors(a), tensors(b)
    assert [p for p, _ in ta] == [p for p, _ in tb]
    for (path, x), (_, y) in zip(ta, tb):
        assert x.dtype == y.dtype and x.shape == y.shape, path
        if tol == 0.0 or x.dtype == torch.uint8:
            assert torch.equal(x, y), path
        else:
            assert torch.allclose(x, y, rtol=0, atol=tol), (path, float((x - y).abs().max()))
    strip = lambda s: {k: v for k, v in s.items() if k not in ("encoder", "loss", "data_rng")}  # noqa: E731
    assert {**strip(a), "optimizer": a["optimizer"]["param_groups"]} == {
        **strip(b),
        "optimizer": b["optimizer"]["param_groups"],
    }
    assert a["optimizer"]["state"].keys() == b["optimizer"]["state"].keys()


def assert_results(pack_row: dict, solo_row: dict, tol: float = 0.0) -> None:
    """Train or evaluation dicts: the same keys, numbers equal (or within ``tol``); NaN equals NaN."""
    pack_row = {k: v for k, v in pack_row.items() if k != "status"}
    solo_row = {k: v for k, v in solo_row.items() if k != "status"}
    assert pack_row.keys() == solo_row.keys()
    for key, v in solo_row.items():
        w = pack_row[key]
        if isinstance(v, float) and math.isnan(v):
            assert math.isnan(w), key
        elif isinstance(v, float | list) and tol:
            assert w == pytest.approx(v, rel=tol, abs=tol), key
        else:
            assert w == v, key


def solo(config: RunConfig, chunks: list[int]) -> tuple[Experiment, list[dict]]:
    exp = Experiment(config)
    return exp, [exp.train(n) for n in chunks]


# ------------------------------------------------------------------ fields and signatures
def test_every_runconfig_field_is_classified():
    fields = set(RunConfig.model_fields)
    assert not SHAPE_FIELDS & MEMBER_FIELDS
    assert SHAPE_FIELDS | MEMBER_FIELDS == fields, (
        f"classify in ablate/core/pack_fields.py: {sorted(fields - SHAPE_FIELDS - MEMBER_FIELDS)}; "
        f"no longer RunConfig fields: {sorted((SHAPE_FIELDS | MEMBER_FIELDS) - fields)}"
    )


def test_signature_ignores_member_fields_and_sees_shapes_and_paths():
    a, b, c = configs("aninfonce")
    assert pack_signature(a) == pack_signature(b) == pack_signature(c)
    assert pack_signature(a) != pack_signature(a.model_copy(update={"batch_size": 64}))
    fixed = RunConfig.build({**SMALL, "fixed_lambda_hat": 2.0})
    assert pack_signature(a) != pack_signature(fixed)  # learned against fixed Λ̂ is another code path
    with pytest.raises(ValueError, match="member 1: batch_size is 64 but member 0 has 32"):
        PackedExperiment([a, RunConfig.build({**SMALL, "batch_size": 64})])


def test_losses_without_a_packed_form_say_why():
    tricl = RunConfig.build({**SMALL, "loss": "tricl"})
    ensemble = RunConfig.build({**SMALL, "loss": "ensemble_aninfonce", "ensemble": ["5/25", "25/5"]})
    for config in (tricl, ensemble):
        ok, why = can_pack(config)
        assert not ok and "no batched loss" in why
        with pytest.raises(ValueError, match=f"cannot pack loss '{config.loss}'"):
            PackedExperiment([config])
    for variant in VARIANTS:
        assert can_pack(configs(variant, 1)[0]) == (True, "")
    cfgs = [*configs("aninfonce"), tricl, configs("infonce", 1)[0], configs("aninfonce", 1)[0]]
    assert pack_groups(cfgs) == [[0, 1, 2, 5], [3], [4]]
    assert pack_groups(cfgs, max_size=2) == [[0, 1], [2, 5], [3], [4]]


# ------------------------------------------------------------------ a member equals its solo run
@pytest.mark.parametrize("variant", ["aninfonce", "infonce"])
def test_pack_of_one_equals_solo_bit_for_bit(variant):
    schedule = {"warmup_steps": 5, "lr_schedule": "cosine", "max_steps": 30} if variant == "aninfonce" else {}
    (config,) = configs(variant, 1, **schedule)
    pack = PackedExperiment([config])
    exp, solo_rows = solo(config, [12, 18])
    solo_eval = exp.evaluate()
    pack_rows = [pack.train(12)[0], pack.evaluate()[0], pack.train(18)[0]]
    assert pack_rows[0]["status"] == "training"
    assert_results(pack_rows[0], solo_rows[0])
    assert_results(pack_rows[2], solo_rows[1])
    assert_results(pack.evaluate()[0], solo_eval)
    assert_states(member_state(pack.state_dict(), 0), exp.state_dict())
    if variant == "aninfonce":
        assert torch.equal(pack.lambda_hat()[0], exp.lambda_hat())
    else:
        assert pack.lambda_hat() is None


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_each_member_of_a_pack_equals_its_solo_run_bit_for_bit(variant):
    cfgs = configs(variant)
    pack = PackedExperiment(cfgs)
    assert pack.solo_kernels  # the CPU's default
    rows = [*pack.train(6), *pack.train(6)]
    evals = pack.evaluate()
    for i, config in enumerate(cfgs):
        exp, solo_rows = solo(config, [6, 6])
        assert_results(rows[i], solo_rows[0])
        assert_results(rows[3 + i], solo_rows[1])
        assert_results(evals[i], exp.evaluate())
        assert_states(pack.member_state_dict(i), exp.state_dict())


def test_a_laptop_grid_s_pack_equals_its_solo_runs_bit_for_bit():
    """The shapes of batch_vs_lambda's laptop scale (d = 20, the fast preset's encoder, batch 64), where a batched
    CPU step (MKL's batched gemm, slices of stacked tensors, softplus's vector kernel) moved R² by 1e-8 after 30
    steps on an AMD EPYC and by 1e-5 over a run on an Intel Xeon."""
    grid = load_grid("batch_vs_lambda", "laptop")
    group = next(g for g in pack_groups([t.config for t in grid.trials], 4) if len(g) == 4)
    cfgs = [grid.trials[i].config.model_copy(update={"eval_samples": 512}) for i in group]
    pack = PackedExperiment(cfgs)
    rows = pack.train(5)
    for i, config in enumerate(cfgs):
        exp, (solo_row,) = solo(config, [5])
        assert_results(rows[i], solo_row)
        assert_states(pack.member_state_dict(i), exp.state_dict())
    assert_results(pack.evaluate([3])[0], exp.evaluate())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_batched_path_matches_each_solo_run(variant):
    """The GPU's path (one bmm per layer for the whole pack, the batched fused loss), run on the CPU in float64."""
    cfgs = configs(variant, dtype="float64")
    pack = PackedExperiment(cfgs)
    pack.solo_kernels = False
    rows = pack.train(10)
    evals = pack.evaluate()
    for i, config in enumerate(cfgs):
        exp, (solo_row,) = solo(config, [10])
        assert_results(rows[i], solo_row, TOL)
        assert_results(evals[i], exp.evaluate(), 1e-9)
        assert_states(pack.member_state_dict(i), exp.state_dict(), TOL)


class _KernelCalls(TorchDispatchMode):
    """Records each matrix product and softplus call: the op, and per tensor operand its shape, strides and, for a
    product, its address modulo 64 (MKL's sgemm rounds by the alignment of its operands; torch's element-wise
    kernels split a tensor into vector and scalar parts by index, not by address)."""

    PRODUCTS = ("mm", "addmm", "bmm", "baddbmm")
    WATCHED = (*PRODUCTS, "softplus", "softplus_backward")

    def __init__(self):
        super().__init__()
        self.calls: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.WATCHED:
            aligned = name in self.PRODUCTS
            operands = tuple(
                (tuple(a.shape), a.stride(), a.data_ptr() % 64 if aligned else None)
                for a in args
                if isinstance(a, torch.Tensor)
            )
            self.calls[(name, operands)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("variant", ["aninfonce", "infonce_reference", "hard_negatives"])
def test_a_member_makes_its_solo_run_s_kernel_calls(variant):
    """The mechanism behind bit-equality on any CPU: a pack step makes, for each member, exactly the matrix
    products and softplus calls of its solo step, on operands of the same shapes, strides and alignment, and no
    batched matmul (which torch hands to MKL's batched gemm for k ≥ 2)."""
    cfgs = configs(variant, hard_negatives_from_step=0) if variant == "hard_negatives" else configs(variant)
    pack = PackedExperiment(cfgs)
    pack.prefetch = False
    with _KernelCalls() as packed:
        pack.train(1)
    expected: Counter = Counter()
    for config in cfgs:
        exp = Experiment(config)
        exp.prefetch = False
        with _KernelCalls() as alone:
            exp.train(1)
        expected += alone.calls
    assert not any(name in ("bmm", "baddbmm") for name, _ in packed.calls)
    assert packed.calls == expected


def test_each_member_gets_only_its_own_gradient():
    pack = PackedExperiment(configs("aninfonce"))
    x = torch.randn(3, 2 * SMALL["batch_size"], SMALL["latent_dim"], generator=torch.Generator().manual_seed(0))

    def grads(weights: list[float], poison: bool = False):
        params = [p.detach().clone().requires_grad_() for p in pack._params]
        if poison:  # member 1's weights non-finite
            with torch.no_grad():
                params[0][1].fill_(float("nan"))
        losses = pack._losses(x, params, None, hard=False)
        return torch.autograd.grad((losses * torch.tensor(weights)).sum(), params)

    base, scaled, poisoned = grads([1, 1, 1]), grads([1, 5, 1]), grads([1, 1, 1], poison=True)
    for b, s, p in zip(base, scaled, poisoned):
        for i in (0, 2):
            assert torch.equal(b[i], s[i]) and torch.equal(b[i], p[i])
        assert not torch.equal(b[1], s[1])
        assert torch.isnan(p[1]).any()


# ------------------------------------------------------------------ state, freezing, failures
def _roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("include_members", [True, False])
def test_resume_equals_never_stopping(include_members):
    cfgs = configs("hard_negatives")  # hard negatives start at step 5, inside the first half
    straight = PackedExperiment(cfgs)
    straight.train(8)
    straight.freeze(2)
    straight_rows = straight.train(8)
    first = PackedExperiment(cfgs)
    first.train(8)
    first.freeze(2)
    saved = _roundtrip(first.state_dict(include_members=include_members))
    assert ("members" in saved) == include_members
    resumed = PackedExperiment(cfgs)
    resumed.load_state_dict(saved)
    assert resumed.frozen == {2} and resumed.steps == [8, 8, 8]
    for row, straight_row in zip(resumed.train(8), straight_rows):
        assert_results(row, straight_row)
    for i in range(3):
        assert_states(resumed.member_state_dict(i), straight.member_state_dict(i))
    # a pack can also resume from its members' solo states (each trial folder's own checkpoint)
    from_members = PackedExperiment(cfgs)
    from_members.load_state_dict({"members": first.state_dict(include_members=True)["members"], "frozen": [2]})
    from_members.train(8)
    for i in range(3):
        assert_states(from_members.member_state_dict(i), straight.member_state_dict(i))


def test_frozen_member_stays_bit_identical_while_others_train():
    cfgs = configs("aninfonce", dtype="float64")
    pack = PackedExperiment(cfgs)
    pack.train(6)
    pack.freeze(1)
    before = pack.member_state_dict(1)
    rows = pack.train(6)
    assert rows[1]["status"] == "frozen" and rows[1]["step"] == 6 and math.isnan(rows[1]["loss"])
    assert pack.steps == [12, 6, 12] and pack.active == [0, 2]
    assert_states(pack.member_state_dict(1), before)
    assert_results(pack.evaluate([1])[0], solo(cfgs[1], [6])[0].evaluate(), 1e-9)
    for i in (0, 2):
        exp, (_, second) = solo(cfgs[i], [6, 6])
        assert_results(rows[i], second, TOL)
        assert_states(pack.member_state_dict(i), exp.state_dict(), TOL)


@pytest.mark.parametrize(
    ("prefetch", "solo_kernels"), [(True, True), (False, True), (False, False)],
    ids=["prefetch", "no-prefetch", "batched-device-mask"],
)  # fmt: skip
def test_non_finite_member_fails_and_the_others_go_on(prefetch, solo_kernels):
    """With solo kernels the host reads each step's finiteness; on the batched path (a GPU's) a device-side mask
    freezes the member and the host reads its failing step once, at the end of train: the same outcome."""
    cfgs = configs("aninfonce", dtype="float64", prefetch=prefetch)
    cfgs[1] = cfgs[1].model_copy(update={"lr": 1e200, "lr_lambda": 1e200})  # float64 overflows at step 2
    pack = PackedExperiment(cfgs)
    pack.prefetch, pack.solo_kernels = prefetch, solo_kernels
    rows = pack.train(10) + pack.train(5)
    assert pack.failed == {1: 2} and pack.active == [0, 2]
    assert "non-finite at step 2" in str(pack.error(1))
    assert rows[1]["status"] == "failed" and rows[1]["step"] == 1 and math.isfinite(rows[1]["loss"])
    # the failed member keeps its state after its last finite step, data generator included
    last_finite, _ = solo(cfgs[1], [1])
    assert_states(pack.member_state_dict(1), last_finite.state_dict())
    for i in (0, 2):
        exp, solo_rows = solo(cfgs[i], [10, 5])
        assert_results(rows[i], solo_rows[0], TOL)
        assert_results(rows[3 + i], solo_rows[1], TOL)
        assert_states(pack.member_state_dict(i), exp.state_dict(), TOL)


def test_a_pack_checkpoint_holds_each_weight_once():
    pack = PackedExperiment(configs("aninfonce"))
    pack.train(3)
    sizes = {}
    for with_members in (False, True):
        buffer = io.BytesIO()
        torch.save(pack.state_dict(include_members=with_members), buffer)
        sizes[with_members] = buffer.tell()
    weights_and_moments = 3 * sum(t.numel() * t.element_size() for t in pack._params)
    assert sizes[True] - sizes[False] > weights_and_moments  # the members' copies: what checkpoints leave out


def test_member_state_loads_into_experiment_and_continues_solo():
    cfgs = configs("infonce", dtype="float64")
    pack = PackedExperiment(cfgs)
    pack.train(7)
    state = _roundtrip(pack.state_dict())
    assert "members" not in state  # each weight once: a member's solo state is derived when it is needed
    for i, config in enumerate(cfgs):
        exp = Experiment(config)
        exp.load_state_dict(member_state(state, i))
        assert exp.step == 7
        continued = exp.train(5)
        reference, (_, second) = solo(config, [7, 5])
        assert_results(continued, second, TOL)
        assert exp.data_rng.get_state().equal(reference.data_rng.get_state())


@pytest.mark.parametrize("variant", ["aninfonce", "infonce"])
def test_plain_loss_path_equals_the_solo_loss(variant):
    """Without a gradient (and on a GPU) the packed loss builds each member's logits matrix instead of the fused
    row blocks; it must give each member's solo loss (float32: within rounding)."""
    cfgs = configs(variant)
    pack = PackedExperiment(cfgs)
    h = torch.nn.functional.normalize(torch.randn(3, 2 * SMALL["batch_size"], SMALL["latent_dim"]), dim=-1)
    b = SMALL["batch_size"]
    lam = pack.lambda_hat()
    with torch.no_grad():
        packed = pack_loss(variant, h[:, :b], h[:, b:], None, lam=lam, tau=pack._tau, inv_tau=pack._inv_tau)
        for i, config in enumerate(cfgs):
            solo_loss = Experiment(config).loss
            if lam is not None:
                solo_loss.theta.copy_(pack._params[-1][i])
            assert float(packed[i]) == pytest.approx(float(solo_loss(h[i, :b], h[i, b:])), rel=1e-6)


@pytest.mark.parametrize("sampler", ["adaptive", "fixed"])
def test_a_batched_step_reads_nothing_from_the_device(sampler):
    """On a GPU a host sync (a value read, a tensor built from Python values) stalls the card. On the batched path
    a step syncs only in the sampler: the learning rates are a device tensor built once, a member's failure is a
    device-side mask read once per train call, and the training members' index is built once per call. So more
    steps in a call add no sync but the adaptive sampler's rounds; the fixed sampler draws batches ahead and reads
    their miss flags once per chunk of up to 32 (benchmarks/step_ops.py counts and prints them)."""
    from benchmarks.step_ops import HostSyncs

    def calls(steps: int) -> dict:
        pack = PackedExperiment([c.model_copy(update={"sampler": sampler}) for c in configs("aninfonce")])
        pack.solo_kernels, pack.prefetch = False, False
        pack.train(1)
        with HostSyncs() as syncs:
            pack.train(steps)
        return syncs.calls

    short, long = calls(2), calls(6)
    per_step = {name: (long[name] - short[name]) / 4 for name in long if long[name] != short[name]}
    assert short["tensor"] == long["tensor"] and short["tolist"] == long["tolist"], (short, long)
    sampler_reads = {"__bool__", "__int__", "nonzero", "__getitem__[bool]"}
    assert set(per_step) <= sampler_reads, per_step
    if sampler == "fixed":  # the flags of a chunk of batches drawn ahead are read at once: none per step
        assert per_step == {}, per_step
