"""MVPO against its written spec (shared/MVPO_SPEC.md): the three worked cases, every intermediate
number the spec prints that the credit exposes, to 1e-5; and the spec's properties (section 7).

The cases' columns are typed in from the spec's tables (rollouts, keys, signatures, triggers,
rewards); the expected numbers are the spec's, computed there by hand from the equations.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest

from hgpo_train.advantage import gigpo_advantages, grpo_advantages
from hgpo_train.advantage.mvpo import BRANCHES, MVPOState, mvpo_advantages
from hgpo_train.advantage.returns import episode_scores
from hgpo_train.advantage.settings import MVPOSettings

NONE = (0, 0, 0, 0, 0)


@dataclass
class Rollout:
    """One rollout as the spec's tables give it: per row its state key, reward and invalid flag;
    per observation (one more than rows) its signature and triggers."""

    keys: list[int]
    signatures: list[str]
    triggers: list[tuple[int, ...]]
    rewards: list[float] = field(default_factory=list)
    invalid: list[int] = field(default_factory=list)
    won: bool = False


def columns(groups: list[list[Rollout]]) -> dict:
    """The batch's row columns, rows of each rollout in order."""
    out: dict[str, list] = {
        k: []
        for k in (
            "rewards",
            "traj",
            "group",
            "keys",
            "won",
            "sig",
            "next_sig",
            "trig",
            "next_trig",
            "invalid",
        )
    }
    traj = 0
    for g, rollouts in enumerate(groups):
        for rollout in rollouts:
            steps = len(rollout.keys)
            assert len(rollout.signatures) == len(rollout.triggers) == steps + 1
            out["rewards"] += rollout.rewards or [0.0] * steps
            out["invalid"] += rollout.invalid or [0] * steps
            out["traj"] += [traj] * steps
            out["group"] += [g] * steps
            out["keys"] += rollout.keys
            out["won"] += [0] * (steps - 1) + [int(rollout.won)]
            out["sig"] += rollout.signatures[:-1]
            out["next_sig"] += rollout.signatures[1:]
            out["trig"] += rollout.triggers[:-1]
            out["next_trig"] += rollout.triggers[1:]
            traj += 1
    return {k: np.array(v) for k, v in out.items()}


def credit(batch: dict, **options):
    return mvpo_advantages(
        batch["rewards"],
        batch["traj"],
        batch["group"],
        batch["keys"][:, None],
        batch["won"],
        batch["sig"],
        batch["next_sig"],
        batch["trig"],
        batch["next_trig"],
        batch["invalid"],
        **options,
    )


def gigpo(batch: dict, omega: float = 0.5) -> np.ndarray:
    """The project's GiGPO with step weight ω, mean_std_norm (spec section 5)."""
    from hgpo_train.advantage import step_returns

    returns = step_returns(batch["rewards"], batch["traj"], 0.95, batch["invalid"], 0.1)
    scores = episode_scores(batch["rewards"], batch["traj"], batch["invalid"], 0.1)
    return gigpo_advantages(returns, scores, batch["group"], batch["keys"][:, None], step_weight=omega)


S, C, PA, PB, H1, H2 = 1, 2, 3, 4, 5, 6
CASE1 = [
    [
        Rollout(
            [S, C, PA],
            ["start|none|d0", "countertop|knife+mug|d0", "countertop|mug|d0", "fridge|none|d3"],
            [NONE, NONE, (1, 0, 0, 0, 0), NONE],
        ),
        Rollout(
            [S, C, PB],
            ["start|none|d0", "countertop|knife+mug|d0", "countertop|knife|d0", "sinkbasin|none|d3"],
            [NONE] * 4,
        ),
        Rollout(
            [S, H1, H2], ["start|none|d0", "shelf|vase|d0", "shelf|vase|d0", "shelf|none|d3"], [NONE] * 4
        ),
    ]
]
W, R1, R2, I1, I2 = 1, 2, 3, 4, 5
CASE2 = [
    [
        Rollout(
            [W, R1, I1],
            ["init|d0", "search_result|d0", "item_sub|d0", "bought|d3"],
            [NONE, (1, 0, 0, 0, 0), (1, 1, 1, 0, 0), (1, 1, 1, 1, 0)],
            rewards=[0, 0, 10],
            won=True,
        ),
        Rollout(
            [W, R2, W],
            ["init|d0", "search_result|d0", "init|d0", "search_result|d3"],
            [NONE, (1, 0, 0, 0, 0), NONE, (1, 0, 0, 0, 0)],
        ),
        Rollout(
            [W, R2, I2],
            ["init|d0", "search_result|d0", "item_detail|d0", "bought|d3"],
            [NONE, (1, 0, 0, 0, 0), (1, 1, 0, 0, 0), (1, 1, 1, 1, 0)],
        ),
    ]
]
N = 7
CASE3 = [
    [
        Rollout(
            [S, C],
            ["start|none|d0", "countertop|apple+bread|d0", "countertop|apple|d0"],
            [NONE, NONE, (1, 0, 0, 0, 0)],
        ),
        Rollout(
            [S, N],
            ["start|none|d0", "none|none|d0", "countertop|apple+bread|d0"],
            [NONE, (0, 0, 0, 0, 1), NONE],
            invalid=[1, 0],
        ),
        Rollout([S, C], ["start|none|d0", "countertop|apple+bread|d0", "fridge|none|d0"], [NONE] * 3),
    ]
]


def branch_names(result) -> list[str]:
    return [BRANCHES[b] for b in result.branch]


def test_case_1_all_fail_gets_potential_credit_where_gigpo_gives_none():
    batch = columns(CASE1)
    result = credit(batch)
    assert result.kappa == 1.0
    np.testing.assert_allclose(result.state.weights, (0.19, 0.285, 0.475, 9.5, 0.0), atol=1e-5)
    assert result.state.success_anchor == result.state.success_ema == 0.0
    expected_scaled = [
        0.039858,
        2.121031,
        -0.099646,
        0.039858,
        0.065481,
        0.008541,
        -1.402634,
        0.087309,
        1.583894,
    ]
    np.testing.assert_allclose(result.potential, expected_scaled, atol=1e-5)
    assert branch_names(result) == ["potential", "potential", "singleton"] * 2 + [
        "potential",
        "singleton",
        "singleton",
    ]
    expected = [0.019929, 1.060516, 0, 0.019929, 0.032741, 0, -0.701317, 0, 0]
    np.testing.assert_allclose(result.advantages, expected, atol=1e-5)
    assert not gigpo(batch).any()  # GiGPO gives nothing here


def test_case_2_mixed_changes_only_the_zero_spread_anchor():
    batch = columns(CASE2)
    state = MVPOState(success_anchor=0.10, success_ema=0.30)
    result = credit(batch, state=state, settings=MVPOSettings(kappa_min=0.01))
    assert result.kappa == pytest.approx(0.775926, abs=1e-5)
    assert (
        result.state.success_ema == pytest.approx(0.301667, abs=1e-5) and result.state.success_anchor == 0.10
    )
    np.testing.assert_allclose(result.state.weights, (0.19, 0.298975, 0.499845, 9.511180, 0.0), atol=1e-5)
    # rows: A0 A1 A2 B0 B1 B2 C0 C1 C2
    assert branch_names(result) == [
        "anchor", "singleton", "singleton", "anchor", "potential", "anchor", "anchor", "potential", "singleton"
    ]  # fmt: skip
    np.testing.assert_allclose(result.potential[[4, 7]], [0.028084, 0.312844], atol=1e-5)
    expected = [
        2.083333,
        1.333333,
        1.333333,
        -0.916666,
        -0.655771,
        -0.916666,
        -0.916666,
        -0.545295,
        -0.666667,
    ]
    np.testing.assert_allclose(result.advantages, expected, atol=1e-5)
    changed = np.flatnonzero(np.abs(result.advantages - gigpo(batch)) > 1e-12)
    assert changed.tolist() == [4, 7]  # only B1 and C1 differ from GiGPO(ω)


def test_case_3_an_invalid_action_keeps_its_anchor_on_gigpo_credit():
    batch = columns(CASE3)
    result = credit(batch, state=MVPOState(success_anchor=0.10, success_ema=0.60))
    assert result.kappa == pytest.approx(0.477778, abs=1e-5)
    assert branch_names(result) == ["anchor", "potential", "anchor", "singleton", "anchor", "potential"]
    expected_scaled = [0.020092, 2.437785, 0.147339, -0.113853, 0.020092, 0.147339]
    np.testing.assert_allclose(result.potential, expected_scaled, atol=1e-5)
    expected = [0.696908, 0.990599, -2.618532, 0.408238, 0.696908, 0.443436]
    np.testing.assert_allclose(result.advantages, expected, atol=1e-5)
    np.testing.assert_allclose(
        gigpo(batch), [0.696908, 0.408238, -2.618532, 0.408238, 0.696908, 0.408238], atol=1e-5
    )


def test_the_state_round_trips_through_a_checkpoint_and_carries_the_iterations():
    first = credit(columns(CASE1))
    saved = first.state.to_dict()
    assert MVPOState.from_dict(saved) == first.state
    second = credit(columns(CASE2), state=MVPOState.from_dict(saved))
    assert second.state.success_anchor == 0.0  # s_0 stays the first iteration's
    assert second.state.success_ema == pytest.approx(0.05 / 3)  # (1 - α) 0 + α ⅓


@pytest.mark.parametrize("case", [CASE1, CASE2, CASE3], ids=["case1", "case2", "case3"])
def test_anchor_and_singleton_rows_are_gigpo_bit_for_bit_and_omega_zero_is_grpo(case):
    """Properties 1 and 2."""
    batch = columns(case)
    result = credit(batch)
    routed_by_gigpo = result.branch != 2
    assert np.array_equal(result.advantages[routed_by_gigpo], gigpo(batch)[routed_by_gigpo])
    alone = credit(batch, settings=MVPOSettings(omega=0.0))
    scores = episode_scores(batch["rewards"], batch["traj"], batch["invalid"], 0.1)
    assert np.array_equal(alone.advantages, grpo_advantages(scores, batch["group"]))


def test_kappa_is_one_at_the_start_and_falls_to_its_floor_as_success_rises():
    """Property 5: κ_1 = 1, κ in [κ_min, 1], non-increasing in s̄_k, 1 while s̄_k ≤ s_0."""
    batch = columns(CASE2)  # one of three rollouts won: s̄_k = 0.95 s̄_(k-1) + 0.05 / 3
    assert credit(batch).kappa == 1.0
    kappas = [
        credit(batch, state=MVPOState(success_anchor=0.1, success_ema=ema)).kappa
        for ema in (0.0, 0.08, 0.5, 0.9, 1.0)
    ]
    assert kappas[:2] == [1.0, 1.0]  # s̄_k = 0.017, 0.093: not above s_0
    assert all(a > b for a, b in itertools.pairwise(kappas[1:4])) and kappas[-1] == 0.05


def test_without_success_the_weights_only_decay():
    """Property 6."""
    weights = (1.0, 2.0, 3.0, 4.0, 5.0)
    result = credit(columns(CASE1), state=MVPOState(weights=weights))
    np.testing.assert_allclose(result.state.weights, 0.95 * np.array(weights))


@pytest.mark.parametrize("case", [CASE1, CASE3], ids=["case1", "case3"])
def test_rescaling_the_potential_weights_leaves_the_potential_alone(case):
    """Property 8: multiplying w_k, α_s and α_l by one c > 0 changes no Ā^pot (batches without
    success, where w_k = (1 - β_amp) w_(k-1) scales with w_(k-1))."""
    batch = columns(case)
    base = credit(batch)
    c = 3.0
    scaled = credit(
        batch,
        state=MVPOState(weights=tuple(c * w for w in MVPOState().weights)),
        settings=MVPOSettings(success_weight=0.2 * c, loop_weight=0.2 * c),
    )
    np.testing.assert_allclose(scaled.state.weights, c * np.array(base.state.weights))
    np.testing.assert_allclose(scaled.potential, base.potential, atol=1e-6)


def test_order_names_and_a_duplicated_group_change_nothing():
    """Property 10: row, rollout and group order, renamed keys and signatures, and a second copy
    of a group (which must not join the first's regions)."""
    batch = columns(CASE1)
    base = credit(batch)
    order = np.random.default_rng(0).permutation(3)
    shuffled = columns([[CASE1[0][i] for i in order]])
    again = credit(shuffled)
    rows = np.concatenate([np.arange(3) + 3 * i for i in order])
    np.testing.assert_allclose(again.advantages, base.advantages[rows], atol=1e-12)
    renamed = dict(batch, sig=np.char.add("x", batch["sig"]), next_sig=np.char.add("x", batch["next_sig"]))
    renamed["keys"] = batch["keys"] * 7 + 11
    np.testing.assert_allclose(credit(renamed).advantages, base.advantages, atol=1e-12)
    twice = credit(columns(CASE1 + CASE1))
    np.testing.assert_allclose(twice.potential, np.tile(base.potential, 2), atol=1e-12)


def test_bad_columns_are_one_line_each():
    batch = columns(CASE1)
    with pytest.raises(ValueError, match="milestones must be 5 0/1 flags per row"):
        credit(dict(batch, trig=batch["trig"][:, :4]))
    with pytest.raises(ValueError, match="next_milestones must hold only 0/1"):
        credit(dict(batch, next_trig=batch["next_trig"] * 2))
    with pytest.raises(ValueError, match="signatures must hold one signature per row"):
        credit(dict(batch, sig=batch["sig"][:-1]))
    with pytest.raises(ValueError, match="won must hold only 0/1"):
        credit(dict(batch, won=batch["won"] + 2))
    with pytest.raises(ValueError, match="potential must be 'eq15' or 'appendix'"):
        MVPOSettings(potential="eq29")


def test_reward_magnitudes_move_gigpos_terms_but_not_the_potential():
    """Property 9: the potential reads won flags, signatures and triggers, never rewards."""
    batch = columns(CASE2)
    base = credit(batch)
    louder = credit(dict(batch, rewards=batch["rewards"] * 3.0))
    np.testing.assert_allclose(louder.potential, base.potential, atol=1e-12)
    assert not np.allclose(louder.returns, base.returns)


def test_the_zscore_variant_flips_small_progress_as_the_spec_warns():
    """Choice A9's variant: z-scored, case 1's first rows would move away from the mug."""
    result = credit(columns(CASE1), settings=MVPOSettings(potential_norm="zscore"))
    np.testing.assert_allclose(result.potential[[0, 3]], [-0.226940, -0.226940], atol=1e-5)
    np.testing.assert_allclose(result.advantages[[0, 3]], [-0.113470, -0.113470], atol=1e-5)


def test_the_appendix_potential_values_the_states_before_progress():
    """Choice A1's variant: a region's mean progress to go plus δ times the share of its visits
    after which progress improved. In case 1 (by hand: progress 0.19 / 10.45 after the pickup)
    the countertop with the knife and the mug, where A went on to pick the mug up, is worth 0.109,
    the start 0.073, the shelf, visited twice in a row, -0.1: going to the countertop beats going
    to the shelf."""
    result = credit(columns(CASE1), settings=MVPOSettings(potential="appendix"))
    assert branch_names(result) == branch_names(credit(columns(CASE1)))
    assert result.advantages[0] == result.advantages[3] > 0 > result.advantages[6]
    assert not np.allclose(result.advantages, credit(columns(CASE1)).advantages)
