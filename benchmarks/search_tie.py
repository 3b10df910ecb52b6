"""What tying the fused groups costs a search (issue #96 item 1): on SmolLM2-135M-Instruct, `matgptq search` of four
budgets with q/k/v and gate/up of each block at one width (`--tie`, what vLLM needs to load a mix) against the same
search with every layer free (`--no-tie`), per seed the same parent, calibration and settings.

Protocol (search_minutes.py's parent, calibration ranges, held-out text and scoring):
  search    per seed s and per tie, one `matgptq search` child of the one-shot allocation the search starts from:
            every unit scored alone at widths 2, 3 and 4 on one window of 255 tokens, 5-7 extrapolated from 4 by
            the weight error (sensitivity.py), its knapsack under each budget, written where it beats the uniform
            slice on the 8-window pool (choice.py); no refinement, no evolution, no error or gradient baseline (they
            work on the units alike; on 2 shared cores six full searches did not fit the session), so both make the
            same scorings whatever the machine's load:
              {RECIPE}
            with --calib-range (0.5 + 0.15·s):1 --seed s, once with --tie and once with --no-tie
  scoring   the written mix of each budget on the first 4 × 1024 tokens of the first half of WikiText-2 test (never
            calibrated on), float32, KL to the float32 model and perplexity; tied against untied a tie when the means
            differ by at most the larger of the two seed spreads (sample standard deviations; search_baselines.verdict)

    python -m benchmarks.search_tie [--seeds 0,1,2] [--work runs/search-minutes]    # ~10 min a seed on 2 cores
"""

from __future__ import annotations

import statistics

from benchmarks._search_setup import (page_top, record_seeds, score_named, search_child, seed_parser, seeds_named,
                                      stats)  # fmt: skip
from benchmarks.search_baselines import verdict
from matgptq.execution import format_table

BUDGETS = ("2.5", "3.0", "3.5", "4.0")
RECIPE = ("--calib-tokens", "2040", "--stages", "255:2,510:1", "--generations", "0", "--refine-steps", "0",
          "--sensitivity-top", "4", "--baselines", "uniform")  # fmt: skip
TIES = {"tied": "--tie", "untied": "--no-tie"}
PROTOCOL = __doc__.replace("{RECIPE}", "matgptq search PARENT --budget " + ",".join(BUDGETS) + " --calib wiki.test "
                           + " ".join(RECIPE))  # fmt: skip


MIXES = {"knapsack": "dp_bits", "written": "bits"}  # the mix file's key of each


def measure(parent, work, seed: int) -> dict:
    """One seed: both searches, their knapsack and written mixes scored on the held-out text."""
    out = {}
    for kind, flag in TIES.items():
        done = search_child(parent, work, seed, [*RECIPE, flag], f"tie-seed-{seed}-{kind}", budgets=BUDGETS)
        out[kind] = {"usage": done["usage"],
                     **{m: {b: body[key] for b, body in done["bodies"].items()} for m, key in MIXES.items()},
                     "chosen": {b: body["summary"]["chosen"] for b, body in done["bodies"].items()}}  # fmt: skip
    named = {b: {f"{k} {m}": out[k][m][b] for k in TIES for m in MIXES} for b in BUDGETS}
    scores = score_named(parent, named)
    for kind in TIES:
        out[kind]["held_out"] = {m: {b: scores[b][f"{kind} {m}"] for b in BUDGETS} for m in MIXES}
        for m in MIXES:  # the widths stay in the mix files under --work; the record keeps their scores
            del out[kind][m]
    return out


def rows(data: dict, mix: str) -> list[dict]:
    """Per budget, for the `mix` of both searches (MIXES): held-out KL and perplexity, the ratio tied / untied per
    seed and the verdict."""
    seeds = sorted(data["seeds"])
    out = []
    for b in BUDGETS:
        got = {k: [data["seeds"][s][k]["held_out"][mix][b] for s in seeds] for k in TIES}
        kl = {k: [x["kl"] for x in v] for k, v in got.items()}
        ratio = [t / u for t, u in zip(kl["tied"], kl["untied"])]
        out.append({"budget": b, "tied_kl": kl["tied"], "untied_kl": kl["untied"],
                    "tied_ppl": [x["ppl"] for x in got["tied"]], "untied_ppl": [x["ppl"] for x in got["untied"]],
                    "bits": [x["bits"] for x in got["tied"] + got["untied"]], "ratio": ratio,
                    "verdict": verdict(kl["tied"], kl["untied"])})  # fmt: skip
    return out


def page(data: dict) -> str:
    """docs/results/search_tie.md from its JSON."""
    seeds = sorted(data["seeds"])
    table = [[m, r["budget"], f"{max(r['bits']):.3f}", stats(r["tied_kl"]), stats(r["untied_kl"]),
              f"{statistics.mean(r['ratio']):.3f}", stats(r["tied_ppl"], 2), stats(r["untied_ppl"], 2), r["verdict"]]
             for m in MIXES for r in rows(data, m)]  # fmt: skip
    minutes = {k: statistics.mean(data["seeds"][s][k]["usage"]["cpu"] for s in seeds) / 60 for k in TIES}
    lines = page_top("search_tie", "Tied fused groups against free layers", data)
    lines += [f"{seeds_named(seeds)}; held-out KL and perplexity, mean ± sample standard deviation over the seeds; "
              "`tied / untied` the mean of the per-seed ratios of KL; `verdict` tie within the larger seed spread, "
              "else above (tied worse) or below (tied better).", "",
              "`knapsack` is each search's one-shot allocation, `written` the mix file's choice between it and the "
              "uniform slice.", "",
              "```", format_table(["mix", "budget", "bits≤", "tied KL", "untied KL", "tied / untied", "tied ppl",
                                   "untied ppl", "verdict"], table), "```", "",
              "CPU time of the search, mean over the seeds: " + ", ".join(f"{k} {m:.1f} min" for k, m in
                                                                       minutes.items()) + " (2 cores shared with "
              "other work, so only their order is meaningful: the tied table scores one unit per fused group, 120 "
              "on SmolLM2 where the untied one scores its 210 layers)."]
    return "\n".join(lines)


def main(argv=None) -> None:
    a = seed_parser(__doc__, "search_tie.json").parse_args(argv)
    record_seeds("search_tie", a, RECIPE, PROTOCOL, measure, page)


if __name__ == "__main__":
    main()
