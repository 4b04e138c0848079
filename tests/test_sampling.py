"""Sampler chain: each step on hand-made logits, then the chain and its seeded draw.

The seeded draws are pinned to numbers from C++: std::mt19937 and its canonical doubles from a
g++ 12 / libstdc++ program, and whole draw sequences from llama.cpp's own sampler chain
(src/llama-sampler.cpp, linked from the llama-server build) on the same logits.
"""

import math

import numpy as np
import pytest

from engine.sampling import (
    Candidates,
    SamplingParams,
    add_bias,
    bias_arrays,
    candidates_of,
    logsumexp,
    make_sampler,
    min_p,
    penalties,
    resolve_seed,
    sample_dist,
    temperature,
    top_k,
    top_k_ids,
    top_logprobs,
    top_p,
    typical,
)
from engine.sampling.std_random import StdMt19937

NEG_INF = -np.inf


def logits_of(probs):
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(probs, dtype=np.float32))


def vector(c, n):
    """The list as a logits vector (n,): the tokens left out at -inf."""
    out = np.full(n, -np.inf, np.float32)
    out[c.ids] = c.logits
    return out


def probs_of(c, n):
    x = vector(c, n).astype(np.float64)
    e = np.exp(x - np.max(x))
    return e / e.sum()


def kept(c):
    """Ids of the tokens the list still holds with a finite logit, ascending."""
    return sorted(c.ids[np.isfinite(c.logits)].tolist())


def log_softmax(x):
    return x.astype(np.float64) - logsumexp(x)


def test_defaults_match_llama_cpp():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.8, 40, 0.95, 0.05, 1.0)
    assert (p.repeat_penalty, p.repeat_last_n, p.presence_penalty, p.frequency_penalty) == (
        1.0,
        64,
        0.0,
        0.0,
    )
    assert p.seed == -1 and p.n_probs == 0 and p.logit_bias == {} and not p.ignore_eos


def test_top_p_keeps_smallest_set_reaching_p():
    c = candidates_of(logits_of([0.9, 0.0, 0.0, 0.1]))
    np.testing.assert_allclose(probs_of(top_p(c, 0.3), 4), [1, 0, 0, 0])
    out = top_p(c, 0.95)
    np.testing.assert_allclose(probs_of(out, 4), [0.9, 0, 0, 0.1], rtol=1e-6)
    assert out.sorted and out.ids.tolist() == [0, 3]
    c = candidates_of(logits_of([0.0, 0.5, 0.4, 0.1]))
    assert kept(top_p(c, 0.4)) == [1]
    assert kept(top_p(c, 0.9)) == [1, 2]  # cumulative >= p (0.5 + 0.4 reaches 0.9)
    assert kept(top_p(c, 0.91)) == [1, 2, 3]


def test_top_p_disabled_and_min_keep():
    c = candidates_of(logits_of([0.9, 0.05, 0.05]))
    assert top_p(c, 1.0) is c
    assert kept(top_p(c, 0.1, min_keep=2)) == [0, 1]


def test_top_k_keeps_k_largest_sorted():
    c = candidates_of(np.array([1, 3, 3, 2, 0], dtype=np.float32))
    assert kept(top_k(c, 2)) == [1, 2]
    assert top_k(c, 1).ids.tolist() == [1]  # of tied ones, std::partial_sort keeps the first
    assert kept(top_k(c, 3)) == [1, 2, 3]
    assert top_k(c, 0) is c and kept(top_k(c, 10)) == [0, 1, 2, 3, 4]
    # sorted, highest first, the logits unchanged
    out = top_k(c, 3)
    assert out.sorted and out.logits.tolist() == [3, 3, 2]


def test_min_p_keeps_tokens_within_factor_of_top():
    c = candidates_of(logits_of([0.5, 0.3, 0.1, 0.1 - 1e-4, 0.0001]))
    # 0.2 * 0.5 = 0.1: keeps 0.5, 0.3 and exactly 0.1
    assert kept(min_p(c, 0.2)) == [0, 1, 2]
    assert min_p(c, 0.0) is c
    assert kept(min_p(c, 0.99, min_keep=2)) == [0, 1]


def test_typical_keeps_tokens_near_entropy():
    c = candidates_of(logits_of([0.97, 0.01, 0.01, 0.01]))
    # entropy ~0.168; surprise of 0.97 is 0.03 (closest) -> its mass 0.97 > 0.5
    assert kept(typical(c, 0.5)) == [0]
    c = candidates_of(logits_of([0.4, 0.3, 0.2, 0.1]))
    out = typical(c, 0.5)
    assert 0 < len(kept(out)) < 4 and not out.sorted
    assert typical(c, 1.0) is c


def test_temperature_scales_and_greedy_keeps_argmax():
    c = candidates_of(np.array([1.0, 2.0, 4.0], dtype=np.float32))
    np.testing.assert_allclose(temperature(c, 2.0).logits, [0.5, 1.0, 2.0])
    for t in (0.0, -5.0):
        out = temperature(c, t)
        assert out.ids.tolist() == [2] and out.logits.tolist() == [4.0]


def test_penalties_follow_llama_cpp_rule():
    c = candidates_of(np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32))
    out = penalties(c, [0, 1, 0], repeat_last_n=64, repeat_penalty=2.0)
    np.testing.assert_allclose(
        out.logits, [1.0, -4.0, 1.0, 0.5]
    )  # positive divided, negative multiplied
    out = penalties(c, [0, 1, 0], 64, 1.0, frequency_penalty=0.5, presence_penalty=0.25)
    np.testing.assert_allclose(out.logits, [2.0 - 1.0 - 0.25, -2.0 - 0.5 - 0.25, 1.0, 0.5])


def test_penalties_window_and_disabled():
    c = candidates_of(np.array([2.0, 2.0, 2.0], dtype=np.float32))
    out = penalties(c, [0, 1, 2], repeat_last_n=1, repeat_penalty=2.0)
    np.testing.assert_allclose(out.logits, [2.0, 2.0, 1.0])  # only the last token counts
    assert penalties(c, [0, 1], repeat_last_n=0, repeat_penalty=2.0).logits is c.logits
    assert penalties(c, [0, 1], 64).logits is c.logits
    out = penalties(c, [0, 1, 2], repeat_last_n=-1, repeat_penalty=2.0)
    np.testing.assert_allclose(out.logits, [1.0, 1.0, 1.0])


def test_penalties_on_a_cut_list_match_the_whole_vocabulary():
    # after a step that cut the list, the penalties reach its tokens by id (a fresh list takes
    # a shorter path); either way the list is left unsorted, as llama.cpp leaves it
    x = (np.random.default_rng(2).standard_normal(500) * 3).astype(np.float32)
    history = [int(i) for i in np.argsort(x)[-30:]] + [7, 499, 499, 10**6, -1]
    kw = dict(repeat_last_n=-1, repeat_penalty=1.7, frequency_penalty=0.3, presence_penalty=0.2)
    whole = penalties(candidates_of(x), history, **kw)
    cut = top_k(candidates_of(x), 40)
    out = penalties(cut, history, **kw)
    assert not whole.sorted and not out.sorted and out.ids.tolist() == cut.ids.tolist()
    np.testing.assert_array_equal(out.logits, whole.logits[cut.ids])
    assert not penalties(cut, [], **kw).sorted


def test_logit_bias_adds_and_bans():
    x = np.zeros(4, dtype=np.float32)
    out = add_bias(x, *bias_arrays({1: 2.5, 3: -np.inf, 99: 1.0}, 4))
    np.testing.assert_array_equal(out, [0, 2.5, 0, NEG_INF])
    assert x[1] == 0  # pure: input unchanged


def test_sample_dist_is_seeded_and_respects_mask():
    x = np.array([0.0, NEG_INF, 0.0, 0.0], dtype=np.float32)
    rng = StdMt19937(1)
    draws = [sample_dist(candidates_of(x), rng) for _ in range(300)]
    assert set(draws) == {0, 2, 3}
    rng2 = StdMt19937(1)
    assert draws == [sample_dist(candidates_of(x), rng2) for _ in range(300)]


def test_sample_dist_draws_even_for_one_candidate():
    rng = StdMt19937(42)
    assert sample_dist(Candidates(np.array([5]), np.array([0.0], np.float32), True), rng) == 5
    assert rng.raw(1)[0] == 4083286876  # the third output: the draw took two


def test_sampler_greedy_ignores_seed():
    x = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    for seed in (1, 2, -1):
        s = make_sampler(SamplingParams(temperature=0.0, seed=seed))
        assert s.sample(x) == 1


def test_sampler_greedy_applies_bias_and_penalties():
    x = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    assert make_sampler(SamplingParams(temperature=0, logit_bias={1: -np.inf})).sample(x) == 2
    s = make_sampler(SamplingParams(temperature=0, repeat_penalty=1.1))
    assert s.sample(x, history=[1]) == 2


def test_sampler_same_seed_same_tokens():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(50, 100)).astype(np.float32)
    p = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    a = make_sampler(p)
    b = make_sampler(p)
    ta = [a.sample(r) for r in rows]
    assert ta == [b.sample(r) for r in rows]
    c = make_sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=43))
    assert ta != [c.sample(r) for r in rows]
    assert len(set(ta)) > 10


def test_sampler_draws_in_proportion():
    x = logits_of([0.7, 0.2, 0.1])
    s = make_sampler(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=7))
    draws = np.bincount([s.sample(x) for _ in range(4000)], minlength=3) / 4000
    np.testing.assert_allclose(draws, [0.7, 0.2, 0.1], atol=0.03)


def test_sampler_ignore_eos_bans_eog_ids():
    x = np.array([5.0, 1.0, 0.0], dtype=np.float32)
    s = make_sampler(SamplingParams(temperature=0, ignore_eos=True), eog_ids=[0])
    assert s.sample(x) == 1


def test_resolve_seed():
    assert resolve_seed(42) == 42
    assert resolve_seed(0) == 0
    assert resolve_seed(-2) == 0xFFFFFFFE
    seeds = {resolve_seed(-1) for _ in range(5)}
    assert len(seeds) > 1 and all(0 <= s < 0xFFFFFFFF for s in seeds)
    assert make_sampler(SamplingParams(seed=123)).seed == 123


def test_logsumexp_and_top_logprobs():
    x = np.array([1.0, 3.0, 2.0, 3.0], dtype=np.float32)
    lp = log_softmax(x)
    assert math.isclose(np.exp(lp).sum(), 1.0, rel_tol=1e-6)
    top = top_logprobs(x, 3)
    assert [t for t, _ in top] == [1, 3, 2]
    assert top[0][1] == pytest.approx(float(lp[1]))
    assert top_logprobs(x, 0) == ()
    assert len(top_logprobs(x, 10)) == 4


def test_top_k_ids_on_a_large_vocabulary_is_exact():
    rng = np.random.default_rng(3)
    x = rng.normal(size=70000).astype(np.float32)
    x[rng.integers(0, 70000, 500)] = -np.inf
    for k in (1, 40, 1000):
        want = np.sort(np.argsort(-x, kind="stable")[:k])
        np.testing.assert_array_equal(top_k_ids(x, k), want)
    x = np.zeros(70000, np.float32)  # all tied: the lowest ids win
    np.testing.assert_array_equal(top_k_ids(x, 5), np.arange(5))


def test_top_p_head_shortcut_matches_full_sort():
    rng = np.random.default_rng(4)
    x = (rng.normal(size=50000) * 0.5).astype(np.float32)
    x[:20] += 15.0  # a peaked distribution: the head holds almost all the mass
    for p in (0.5, 0.9, 0.999):
        out = top_p(candidates_of(x), p)
        order = np.argsort(-x, kind="stable")
        cum = np.cumsum(np.exp(log_softmax(x))[order])
        n = int(np.argmax(cum >= p)) + 1
        assert kept(out) == sorted(order[:n].tolist())


def test_sampler_chain_equals_steps_on_full_vector():
    rng = np.random.default_rng(5)
    x = (rng.normal(size=5000) * 3).astype(np.float32)
    p = SamplingParams(temperature=0.7, top_k=50, top_p=0.8, min_p=0.1, seed=1)
    c = make_sampler(p).candidates(x)
    steps = temperature(min_p(top_p(top_k(candidates_of(x), 50), 0.8), 0.1), 0.7)
    assert c.sorted and np.all(np.diff(c.logits) <= 0)  # top-k leaves them by logit, highest first
    np.testing.assert_allclose(vector(c, x.size), vector(steps, x.size))


@pytest.mark.parametrize("t", [1e-300, 1e-38, 1e-30])
def test_tiny_temperatures_sample_the_arg_max_without_nan(t):
    logits = np.array([1.0, 5.0, 3.0, -2.0], np.float32)
    with np.errstate(all="raise"):
        out = vector(temperature(candidates_of(logits), t), 4)
    assert not np.isnan(out).any() and int(np.argmax(out)) == 1
    assert np.isfinite(out[1]) and np.all(out[[0, 2, 3]] < out[1])


def test_a_zero_repeat_penalty_gives_no_nan():
    logits = np.array([1.0, 5.0, -3.0, 2.0], np.float32)
    with np.errstate(all="raise"):
        out = penalties(candidates_of(logits), [1, 2], 64, 0.0).logits
    assert not np.isnan(out).any() and int(np.argmax(out)) == 1


# -- bit-for-bit agreement with C++ ----------------------------------------------------------
# std::mt19937 numbers from:
#     std::mt19937 g(seed); g(); ...
#     std::uniform_real_distribution<double> u(0.0f, 1.0f); u(h); ...   (printf "%.17g")
# built with g++ 12.2 (libstdc++), where uniform_real_distribution<double> is
# generate_canonical<double, 53>: two outputs, the first the low half.

MT_RAW = {
    0: [2357136044, 2546248239, 3071714933, 3626093760],
    1: [1791095845, 4282876139, 3093770124, 4005303368],
    42: [1608637542, 3421126067, 4083286876, 787846414],
    4294967294: [2236247450, 437438088, 2243395601, 4071188816],
}
MT_UNIFORM = {
    0: [0.59284461651668263, 0.84426574425659828, 0.85794561998982988, 0.84725173738433124],
    1: [0.99718480823026556, 0.93255736136816547, 0.128124447772306, 0.99904051546527362],
    42: [0.79654298428784598, 0.18343478789336848, 0.77969099761266125, 0.59685016158005655],
    4294967294: [
        0.10184899170898529,
        0.94789751258733013,
        0.82893340139475558,
        0.37232930669741121,
    ],
}


@pytest.mark.parametrize("seed", sorted(MT_RAW))
def test_mt19937_matches_std(seed):
    assert StdMt19937(seed).raw(4).tolist() == MT_RAW[seed]
    rng = StdMt19937(seed)
    assert [rng.canonical() for _ in range(4)] == MT_UNIFORM[seed]  # exact, not approx


def test_mt19937_default_seed_10000th_output():
    assert StdMt19937(5489).raw(10000)[-1] == 4123659995  # the C++ standard's check value


def test_canonical_that_rounds_to_one_stays_below_one():
    class AllOnes:
        def random_raw(self, n):
            return np.full(n, 0xFFFFFFFF, np.uint64)

    rng = StdMt19937(0)
    rng._bits = AllOnes()  # (2**64 - 1) / 2**64 rounds to 1.0 as a double
    assert rng.canonical() == np.nextafter(1.0, 0.0)


# llama.cpp's chain (penalties, top_k, typical, top_p, min_p, temp_ext, dist(seed)) applied 24
# times to this row, accepting each pick: the ids it selected.
LCPP_ROW = np.array([2.0, 1.5, 1.4, 0.3, -1.0, 1.9, 0.0, 1.0], np.float32)
LCPP_DRAWS = [
    (dict(seed=42), [2, 0, 2, 1, 5, 0, 5, 5, 0, 1, 0, 1, 7, 0, 3, 1, 1, 0, 0, 5, 5, 0, 3, 0]),
    (dict(seed=0), [1, 2, 2, 2, 1, 5, 0, 0, 0, 5, 2, 5, 5, 2, 5, 1, 5, 7, 0, 2, 5, 2, 5, 1]),
    # nothing sorts: the candidates stay in id order
    (
        dict(seed=7, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0),
        [0, 1, 7, 2, 1, 1, 0, 1, 0, 2, 6, 1, 1, 5, 5, 5, 1, 7, 0, 5, 0, 5, 0, 5],
    ),
    # typical leaves them in its own order
    (
        dict(seed=3, top_k=0, typical_p=0.9, top_p=1.0, min_p=0.0, temperature=1.5),
        [1, 0, 1, 5, 5, 1, 1, 2, 1, 0, 1, 5, 2, 2, 5, 7, 0, 7, 5, 5, 2, 5, 2, 5],
    ),
    (
        dict(seed=5, top_n_sigma=1.0, top_k=0, top_p=1.0, min_p=0.0, temperature=1.0),
        [0, 5, 1, 5, 0, 1, 1, 1, 5, 5, 2, 5, 0, 5, 0, 0, 0, 5, 1, 1, 5, 0, 0, 5],
    ),
    # XTC draws floats from a second generator with the same seed
    (
        dict(seed=9, xtc_probability=0.5, xtc_threshold=0.1, temperature=1.0),
        [7, 7, 0, 7, 7, 3, 7, 7, 7, 7, 7, 5, 3, 3, 3, 7, 7, 3, 7, 3, 7, 7, 1, 3],
    ),
    (
        dict(seed=11, dynatemp_range=0.6, dynatemp_exponent=1.5, temperature=0.7),
        [0, 1, 0, 7, 0, 0, 7, 2, 0, 7, 2, 1, 2, 1, 2, 2, 3, 3, 2, 0, 7, 5, 0, 0],
    ),
    # a custom order, penalties last (they see the picks so far)
    (
        dict(
            seed=13,
            samplers=("temperature", "top_k", "top_p", "min_p", "penalties"),
            repeat_penalty=1.3,
            temperature=1.2,
        ),
        [1, 7, 3, 0, 2, 2, 1, 7, 5, 5, 2, 3, 2, 1, 1, 1, 1, 6, 2, 0, 2, 6, 1, 1],
    ),
]


@pytest.mark.parametrize("kw,want", LCPP_DRAWS)
def test_sampler_draws_what_llama_cpp_draws(kw, want):
    s = make_sampler(SamplingParams(**kw))
    history: list[int] = []
    for _ in want:
        history.append(s.sample(LCPP_ROW, history))
    assert history == want


def test_float_canonical_matches_std():
    # std::uniform_real_distribution<float>(0.0f, 1.0f): one output each (printf "%.9g")
    for seed, want in (
        (0, [0.548813522, 0.592844605, 0.715189338, 0.844265759]),
        (42, [0.37454012, 0.796543002, 0.95071429, 0.183434784]),
    ):
        rng = StdMt19937(seed)
        got = [rng.canonical_float() for _ in want]
        assert got == [np.float32(w) for w in want]


def test_default_chain_order_and_greedy_shortcut():
    from engine.sampling import DEFAULT_SAMPLERS, active_steps

    assert DEFAULT_SAMPLERS == (
        "penalties",
        "dry",
        "top_n_sigma",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "temperature",
    )
    assert active_steps(SamplingParams()) == ["top_k", "top_p", "min_p", "temperature"]
    p = SamplingParams(
        repeat_penalty=1.1,
        top_n_sigma=2.0,
        typical_p=0.9,
        xtc_probability=0.1,
        samplers=("dry", "top-k", "typical", "temp", "nucleus", "unknown"),
    )
    assert active_steps(p) == ["top_k", "typ_p", "temperature", "top_p"]
    x = np.array([0.5, 3.0, 2.9, -1.0], np.float32)
    # greedy: the arg-max after the penalties; penalties after the temperature step come too
    # late (as in llama.cpp: the others are -inf by then)
    s = make_sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0))
    assert s.sample(x, [1]) == 2
    s = make_sampler(
        SamplingParams(
            temperature=0.0, repeat_penalty=2.0, samplers=("top_k", "temperature", "penalties")
        )
    )
    assert s.sample(x, [1]) == 1


def test_warm_up_compiles_every_kernel():
    from engine.sampling import fused, kernels, std_sort, warm_up

    warm_up()
    # the others are called only from these kernels' compiled code
    entry = [
        getattr(kernels, k)
        for k in (
            "softmax_f32",
            "keep_count",
            "typical_scores",
            "dist_index",
            "logf",
            "sigma_floor",
            "dynamic_temp",
            "bucket_sort",
        )
    ]
    entry += [std_sort.heap_top, std_sort.std_sort, fused.fused_chain]
    assert all(k.signatures for k in entry)


LCPP_TIES = [2, 4, 2, 1, 1, 4, 4, 2, 2, 1, 4, 1]


def test_tied_logits_come_out_in_llama_cpp_order():
    # std::partial_sort's heap decides which tied tokens top-k keeps and in which order;
    # llama.cpp (libstdc++) draws these ids from this row with seed 4, top_k 3, temp 1.5.
    x = np.array([1.0, 2.0, 2.0, 0.5, 2.0, 2.0, 1.0, 2.0], np.float32)
    s = make_sampler(SamplingParams(seed=4, top_k=3, top_p=1.0, min_p=0.0, temperature=1.5))
    assert [s.sample(x) for _ in range(12)] == LCPP_TIES


# 300 tokens with many tied logits and two banned: llama.cpp sorts lists above 128 with its
# bucket sort + std::sort, keeps -inf tokens in the list (its size enters XTC and dynamic
# temperature) and typical's std::sort orders tied scores its own way. Its picks:
TIE_ROW = (np.round(np.sin(np.arange(300) * 1.3) * 8) / 2).astype(np.float32)
TIE_ROW[[5, 77]] = -np.inf
LCPP_TIE_DRAWS = [
    (
        dict(seed=21, top_k=0, top_p=0.9, min_p=0.0, temperature=1.0),
        [103, 199, 291, 281, 190, 233, 50, 122, 74, 214, 59, 262, 112, 98, 69, 258],
    ),
    (
        dict(seed=22, top_k=0, typical_p=0.8, top_p=1.0, min_p=0.0, temperature=1.0),
        [267, 291, 238, 35, 6, 30, 107, 166, 1, 277, 190, 141, 132, 11, 146, 74],
    ),
    (
        dict(
            seed=23,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            top_n_sigma=1.0,
            xtc_probability=1.0,
            xtc_threshold=0.01,
            dynatemp_range=0.5,
            temperature=1.0,
        ),
        [223, 224, 171, 21, 83, 224, 277, 199, 84, 103, 218, 10, 6, 97, 103, 252],
    ),
]


@pytest.mark.parametrize("kw,want", LCPP_TIE_DRAWS)
def test_long_tied_lists_sort_as_llama_cpp_does(kw, want):
    s = make_sampler(SamplingParams(**kw))
    assert [s.sample(TIE_ROW) for _ in want] == want


def test_greedy_with_a_tied_maximum_takes_llama_cpp_first():
    # temp 0 keeps the first highest in the list's order, which top-k's heap decides
    x = np.array([1.0, 2.0, 2.0, 0.5, 2.0, 2.0, 1.0, 2.0], np.float32)
    assert make_sampler(SamplingParams(temperature=0.0, top_k=3)).sample(x) == 4
    assert make_sampler(SamplingParams(temperature=0.0, top_k=40)).sample(x) == 7


@pytest.mark.parametrize("k", [1, 2, 40, 128])
def test_heap_top_keeps_std_partial_sort_order_on_long_tied_rows(k):
    # heap_top keeps only the heap and skips chunks below its top; the plain replay of
    # std::partial_sort over every position (partial_sort) must leave the same order
    from engine.sampling.std_sort import heap_top, partial_sort

    rng = np.random.default_rng(k)
    for _ in range(20):
        x = rng.integers(-6, 6, 3000).astype(np.float32)  # ties everywhere, across chunks
        x[rng.random(x.size) < 0.1] = -np.inf
        h = np.arange(x.size)
        partial_sort(x, h, 0, k, x.size)
        assert np.array_equal(heap_top(x, k), h[:k])


def test_logsumexp_of_a_wide_logit_row_matches_float64():
    # rows spanning more than 87 put expf in subnormals (clamped there: slow, not wrong)
    x = (np.random.default_rng(5).standard_normal(49152) * 40).astype(np.float32)
    x[7] = -np.inf  # a banned token adds nothing
    ref = np.logaddexp.reduce(x.astype(np.float64))
    assert abs(logsumexp(x) - ref) < 1e-5


def _fused_rows():
    rng = np.random.default_rng(5)
    plain = (rng.standard_normal(3000) * 3).astype(np.float32)
    tied = (np.round(plain) / 2).astype(np.float32)  # many ties at the top-k edge
    banned = plain.copy()
    banned[np.argsort(plain)[-7:]] = -np.inf  # the most likely tokens banned
    masked = np.full(3000, -np.inf, np.float32)  # a grammar leaving fewer than top-k
    masked[[3, 70, 900, 901, 2999]] = plain[[3, 70, 900, 901, 2999]]
    spike = plain.copy()
    spike[17] = 3e38  # a temperature below 1 overflows it: temperature()'s shifted form
    tied_max = plain.copy()
    tied_max[[40, 2000]] = plain.max() + 1  # two arg-maxes: greedy leaves it to top-k's heap
    return {
        "plain": plain,
        "tied": tied,
        "tied_max": tied_max,
        "banned": banned,
        "masked": masked,
        "spike": spike,
    }


FUSED_PARAMS = [
    dict(),
    dict(top_k=1),
    dict(top_k=128, top_p=0.5, min_p=0.0),
    dict(top_p=1.0, min_p=0.2),
    dict(top_p=0.99, min_p=0.01, min_keep=5, temperature=1.0),
    dict(temperature=0.3),
    dict(temperature=0.5, top_k=3),
    dict(temperature=0.0),
    dict(temperature=-1.0, top_k=5),
    dict(logit_bias={0: 100.0, 1: -np.inf, 2: 3e38, 10**6: 1.0}),
    dict(temperature=0.0, logit_bias={5: 50.0}),
    dict(ignore_eos=True),
    dict(temperature=0.0, ignore_eos=True),
]


@pytest.mark.parametrize(
    "kw", FUSED_PARAMS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default"
)
def test_fused_chain_keeps_and_draws_what_the_step_by_step_chain_does(kw, monkeypatch):
    # Sampler.candidates runs the common chains in one kernel (fused_chain); the chain step by
    # step (pinned to llama.cpp above) must give the same candidates and the same draws
    from engine.sampling import chain

    eog = list(range(2990, 3000))
    for name, row in _fused_rows().items():
        fused = make_sampler(SamplingParams(seed=77, **kw), eog_ids=eog)
        steps = make_sampler(SamplingParams(seed=77, **kw), eog_ids=eog)
        assert fused.fused is not None
        steps.fused = None
        before = row.copy()
        with monkeypatch.context() as m:
            if name in ("plain", "spike"):  # (ties and full bans leave some rows to the steps)
                m.setattr(
                    chain,
                    "add_bias",
                    lambda *a, row=name: pytest.fail(f"{row}: the step-by-step chain ran"),
                )
            a = fused.candidates(row)
        b = steps.candidates(row)
        np.testing.assert_array_equal(row, before, err_msg=f"{name}: the bias was not undone")
        assert a.sorted == b.sorted and a.ids.tolist() == b.ids.tolist(), name
        np.testing.assert_array_equal(a.logits, b.logits, err_msg=name)
        got = [fused.sample(row) for _ in range(30)]
        assert got == [steps.sample(row) for _ in range(30)], name


def test_greedy_runs_fused_whatever_its_top_k(monkeypatch):
    # the arg-max needs no top-k below the vocabulary; only the top-k chain does
    from engine.sampling import chain

    row = _fused_rows()["plain"]
    want = int(np.argmax(row))
    monkeypatch.setattr(chain, "add_bias", lambda *a: pytest.fail("the step-by-step chain ran"))
    for k in (0, 40, 10**6):
        assert make_sampler(SamplingParams(temperature=0.0, top_k=k)).sample(row) == want


def test_fused_chain_takes_read_only_and_strided_rows():
    rows = np.tile(_fused_rows()["plain"], (2, 1))
    ro = rows[0].copy()
    ro.flags.writeable = False
    for row in (ro, rows[:, ::2][0], rows.T[:, 0]):
        for kw in (dict(ignore_eos=True), dict(ignore_eos=True, temperature=0.0)):
            fused = make_sampler(SamplingParams(seed=3, **kw), eog_ids=[1, 2])
            steps = make_sampler(SamplingParams(seed=3, **kw), eog_ids=[1, 2])
            steps.fused = None
            assert [fused.sample(row) for _ in range(5)] == [steps.sample(row) for _ in range(5)]


@pytest.mark.parametrize(
    "kw",
    [
        dict(repeat_penalty=1.1),
        dict(typical_p=0.9),
        dict(top_k=0),
        dict(top_k=129),
        dict(xtc_probability=0.5),
        dict(dynatemp_range=0.5),
        dict(samplers=("top_k", "min_p", "top_p", "temperature")),
        dict(top_n_sigma=1.0),
        dict(temperature=0.0, samplers=("penalties", "top_k", "temperature"), repeat_penalty=1.2),
    ],
)
def test_other_chains_run_step_by_step(kw):
    assert make_sampler(SamplingParams(**kw)).fused is None


def test_mt19937_draws_ahead_without_changing_the_stream():
    # the generator draws its outputs in blocks; mixed calls across block edges still
    # consume them one after another
    want = [int(v) for v in StdMt19937(9).raw(3000)]
    rng, i = StdMt19937(9), 0
    for step in range(700):
        kind = step % 3
        if kind == 0:
            assert rng.raw(3).tolist() == want[i : i + 3]
            i += 3
        elif kind == 1:
            x = float(want[i] + (want[i + 1] << 32)) / 2.0**64
            assert rng.canonical() == min(x, np.nextafter(1.0, 0.0))
            i += 2
        else:
            assert rng.canonical_float() == np.float32(want[i]) / np.float32(2**32)
            i += 1
    assert i > 1000
