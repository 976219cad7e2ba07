"""The study's statistics (qvi.finetune_study) on made-up runs: its table, paired t (and its p) and paired
bootstrap."""
import numpy as np

from qvi.finetune_study import bootstrap_p, table


def run(variant, seed, correct):
    return {"task": "sentiment", "variant": variant, "seed": seed, "test_items": [[int(c)] for c in correct]}


def test_a_variant_right_on_more_of_the_same_texts_is_ahead_and_significant():
    rng = np.random.default_rng(1)
    rows = []
    for seed in (1, 2, 3):
        base = rng.random(400) < 0.80
        better = base | (rng.random(400) < 0.25)  # right wherever the baseline is, and on a quarter of the rest
        rows += [run("attention", seed, base), run("qvi", seed, better)]
    lines = table(rows).splitlines()
    qvi = next(line for line in lines if "| qvi |" in line).split("|")
    delta, t, p_t, p = float(qvi[5]), float(qvi[6]), float(qvi[7]), float(qvi[8])
    assert 3 < delta < 7 and t > 4 and p_t < 0.05 and p < 0.01


def test_the_same_answers_differ_by_nothing_with_p_one():
    same = [np.array([[1], [0], [1], [1]])] * 2
    assert bootstrap_p(same, same, tagging=False, rounds=200) == 1.0


def test_entity_f1_is_pooled_from_counts_not_averaged_per_text():
    base = [np.array([[1, 2, 2], [0, 0, 2]])]     # 1 right of 2 found, 4 in the corpus: F1 = 2/6
    other = [np.array([[2, 2, 2], [2, 2, 2]])]    # all right: F1 = 1
    rows = [{"task": "ner", "variant": v, "seed": 1, "test_items": items[0].tolist()}
            for v, items in (("plain", base), ("qvi-layers", other))]
    lines = table(rows).splitlines()
    plain = next(line for line in lines if "| plain |" in line)
    assert "33.33 ± 0.00" in plain


def test_the_p_of_the_paired_t_is_students_with_seeds_minus_one_degrees():
    """Three seeds whose differences are +1, +2, +3 points: t = 2 / (1 / √3) = 3.46 on 2 degrees, p = 0.074."""
    rows = []
    for seed, extra in ((1, 1), (2, 2), (3, 3)):
        base = np.zeros(100, dtype=bool)
        base[:50] = True
        better = base.copy()
        better[50:50 + extra] = True
        rows += [run("attention", seed, base), run("qvi", seed, better)]
    qvi = next(line for line in table(rows).splitlines() if "| qvi |" in line).split("|")
    assert (qvi[5].strip(), qvi[6].strip(), qvi[7].strip()) == ("+2.00", "+3.46", "0.074")
