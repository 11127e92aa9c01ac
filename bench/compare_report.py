"""bench/REPORT.md and bench/plots/*.png, generated from bench/results/compare.json.

Never edit REPORT.md by hand: run ``python -m bench.compare_report`` (or the whole
``python -m bench.compare --quick``) to regenerate it.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench import targets

ENGINE_LABEL = {"commitlog": "CommitLog (mqstore)", "segmented": "segmented (Kafka design)"}


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _mr(stat: dict[str, float]) -> str:
    """median [min .. max]"""
    return f"{_fmt(stat['median'])} [{_fmt(stat['min'])} .. {_fmt(stat['max'])}]"


def _rel(path: str, start: str) -> str:
    return os.path.relpath(path, start)


# ---------------------------------------------------------------------- plots


def plot_throughput(results: dict[str, Any], out: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for engine in ("commitlog", "segmented"):
        for flush, style in (("async", "-o"), ("sync", "--s")):
            points = sorted(
                (e["partitions"], e["summary"]["produce_msg_per_s"])
                for e in results["design"]
                if e["engine"] == engine and e["flush"] == flush and e["value_bytes"] == 100
            )
            if not points:
                continue
            xs = [p for p, _ in points]
            med = [s["median"] for _, s in points]
            low = [s["median"] - s["min"] for _, s in points]
            high = [s["max"] - s["median"] for _, s in points]
            producers = "8 producers" if flush == "sync" else "1 producer"
            ax.errorbar(xs, med, yerr=[low, high], fmt=style, capsize=3,
                        label=f"{ENGINE_LABEL[engine]}, {flush} ({producers})")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("partitions (round-robin)")
    ax.set_ylabel("produce, msg/s (median, bars = range)")
    ax.set_title("Producer throughput against partitions, 100 B")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_resources(results: dict[str, Any], out: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    for ax, key, label in zip(
        axes, ("open_fds", "maps", "rss_mib"),
        ("open fds added by the store", "/proc/self/maps lines added", "process RSS, MiB"),
        strict=True,
    ):  # fmt: skip
        for engine in ("commitlog", "segmented"):
            points = sorted(
                (e["partitions"], e["summary"][key]["median"])
                for e in results["design"]
                if e["engine"] == engine and e["flush"] == "async" and e["value_bytes"] == 100
            )
            ax.plot([p for p, _ in points], [v for _, v in points], "-o",
                    label=ENGINE_LABEL[engine])  # fmt: skip
        ax.set_xscale("log")
        if key != "rss_mib":
            ax.set_yscale("symlog")
        ax.set_xlabel("partitions")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _cdf(ax: Any, samples: list[float], label: str) -> None:
    ordered = sorted(samples)
    n = len(ordered)
    ax.plot(ordered, [(i + 1) / n for i in range(n)], label=label)


def plot_latency(results: dict[str, Any], out: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    top = max(e["partitions"] for e in results["design"] if e["engine"] == "segmented")
    for entry in results["design"]:
        if entry["flush"] != "async" or entry["value_bytes"] != 100:
            continue
        if entry["partitions"] not in (1, top):
            continue
        samples = [s for run in entry["runs"] for s in run["oft_samples_us"]]
        _cdf(axes[0], samples, f"{ENGINE_LABEL[entry['engine']]}, {entry['partitions']}p")
    axes[0].set_title("offsets_for_times latency (all repeats)", fontsize=10)
    key_samples = [s for run in results["key_lookup"]["runs"] for s in run["samples_us"]]
    _cdf(axes[1], key_samples, "CommitLog query_by_key")
    axes[1].set_title("key look-up latency (segmented: no key index)", fontsize=10)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("latency, us")
        ax.set_ylabel("fraction <= x")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_peers(results: dict[str, Any], out: str) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [p["name"] for p in results["peers"]]
    width = 0.27
    for i, key in enumerate(("single_msg_per_s", "batch_msg_per_s", "consume_msg_per_s")):
        values = [p["summary"][key]["median"] for p in results["peers"]]
        ax.bar([x + (i - 1) * width for x in range(len(names))], values, width,
               label=key.replace("_msg_per_s", ""))  # fmt: skip
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("msg/s (median)")
    ax.set_title("Peers, 100 B, one thread (per-message, batch of 1,000, consume)")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------- report


def _noise(results: dict[str, Any]) -> list[str]:
    lines = ["## Noise", ""]
    lines.append("Load average (1, 5, 15 min) and the busiest processes, sampled before the "
                 "run, after each repeat and at the end:")  # fmt: skip
    lines.append("")
    for sample in results["load"]:
        top = "; ".join(sample["top"][:3])
        lines.append(f"- {sample['time']}: load {' '.join(sample['loadavg'])}; top: {top}")
    spreads = []
    for entry in results["design"]:
        stat = entry["summary"]["produce_msg_per_s"]
        if stat["median"]:
            spreads.append((stat["max"] - stat["min"]) / stat["median"])
    if spreads:
        spreads.sort()
        lines.append("")
        lines.append(
            f"Spread (max-min)/median of produce throughput over the design cases: median "
            f"{spreads[len(spreads) // 2]:.0%}, worst {spreads[-1]:.0%}. Treat differences "
            "smaller than the ranges as noise."
        )
    lines.append("")
    return lines


def _design_table(results: dict[str, Any]) -> list[str]:
    lines = [
        "| engine | flush | producers | partitions | value B | produce msg/s | dispatch drain s | "
        "consume msg/s | "
        "offsets_for_times p50 / p99 us | set-up s | close s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e in results["design"]:
        s = e["summary"]
        lines.append(
            f"| {e['engine']} | {e['flush']} | {e['producers']} | {e['partitions']:,} | "
            f"{e['value_bytes']} | "
            f"{_mr(s['produce_msg_per_s'])} | {_fmt(s['dispatch_drain_s']['median'])} | "
            f"{_mr(s['consume_msg_per_s'])} | "
            f"{_fmt(s['oft_p50_us']['median'])} / {_fmt(s['oft_p99_us']['median'])} | "
            f"{_fmt(s['setup_s']['median'])} | {_fmt(s['close_s']['median'])} |"
        )
    return lines


def _resource_table(results: dict[str, Any]) -> list[str]:
    lines = ["| engine | partitions | open fds added | maps lines added | RSS MiB |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for e in results["design"]:
        if e["flush"] != "async":
            continue
        s = e["summary"]
        lines.append(
            f"| {e['engine']} | {e['partitions']:,} | {_fmt(s['open_fds']['median'])} "
            f"| {_fmt(s['maps']['median'])} | {_fmt(s['rss_mib']['median'])} |"
        )
    return lines


def _targets_table(results: dict[str, Any]) -> list[str]:
    lines = ["| target | goal | ours msg/s | other | other msg/s | ratio | met? |",
             "|---|---|---:|---|---:|---:|---|"]  # fmt: skip
    for t in results["targets"]:
        ratio = "n/a" if t["ratio"] is None else f"{t['ratio']:.2f}x"
        lines.append(f"| {t['target']} | {t['goal']} | {_fmt(t['ours_msg_per_s'])} | "
                     f"{t['other']} | {_fmt(t['other_msg_per_s'])} | {ratio} | "
                     f"{'MET' if t['met'] else 'MISSED'} |")  # fmt: skip
    return lines


def _peers_table(results: dict[str, Any]) -> list[str]:
    lines = ["| store | durability | setting | per-message msg/s | batch (1,000) msg/s | "
             "consume msg/s |", "|---|---|---|---:|---:|---:|"]  # fmt: skip
    for p in results["peers"]:
        s = p["summary"]
        lines.append(f"| {p['name']} | {p['durability']} | {p['setting']} | "
                     f"{_mr(s['single_msg_per_s'])} | {_mr(s['batch_msg_per_s'])} | "
                     f"{_mr(s['consume_msg_per_s'])} |")  # fmt: skip
    return lines


def _claim(results: dict[str, Any]) -> list[str]:
    """Where the segmented design loses and wins, read off the medians."""
    lines = ["## The seeds' claim on this machine (Alibaba 2016: 64 -> 256 topics, Kafka "
             "-98%, RocketMQ -16%)", ""]  # fmt: skip
    by = {(e["engine"], e["flush"], e["partitions"]): e["summary"]
          for e in results["design"] if e["value_bytes"] == 100}  # fmt: skip
    for flush in ("async", "sync"):
        parts = sorted({p for (_, f, p) in by if f == flush and ("segmented", f, p) in by
                        and ("commitlog", f, p) in by})  # fmt: skip
        if not parts:
            continue
        lines.append(f"- {flush} flush: CommitLog / segmented produce ratio by partitions: "
                     + ", ".join(
                         f"{p:,}p {by[('commitlog', flush, p)]['produce_msg_per_s']['median'] / by[('segmented', flush, p)]['produce_msg_per_s']['median']:.2f}x"  # noqa: E501
                         for p in parts))  # fmt: skip
        for engine in ("commitlog", "segmented"):
            first = by[(engine, flush, parts[0])]["produce_msg_per_s"]["median"]
            last = by[(engine, flush, parts[-1])]["produce_msg_per_s"]["median"]
            lines.append(f"  - {engine}: {parts[0]:,}p -> {parts[-1]:,}p keeps "
                         f"{last / first:.0%} of its throughput")  # fmt: skip
    fsync = results.get("fsync")
    if fsync:
        med = {k: v["median"] for k, v in fsync["summary"].items()}
        producers = results["settings"]["sync_producers"]
        sync_top = max((p for (_, f, p) in by if f == "sync"), default=None)
        lines.append(
            f"- What a durable group costs on this disk, without Python (median of each "
            f"repeat's p50, write + fdatasync of a 170-byte record): one mapped file (a "
            f"CommitLog group) {med['mapped_one_file_us']:.0f} us, one appended file "
            f"{med['append_one_file_us']:.0f} us, {producers} appended files with one "
            f"fdatasync each (a segmented group of {producers} producers on different "
            f"partitions) {med['append_n_files_us']:.0f} us: "
            f"{med['append_n_files_us'] / med['mapped_one_file_us']:.1f}x the CommitLog's."
        )
        if sync_top is not None:
            ours = by[("commitlog", "sync", sync_top)]["produce_msg_per_s"]["median"]
            bound = producers / (med["mapped_one_file_us"] / 1e6)
            lines.append(
                f"  - With {producers} producer threads a group holds at most {producers} "
                f"messages, so the disk alone would allow about {bound:,.0f} msg/s; the "
                f"CommitLog engine reached {ours:,.0f} msg/s at {sync_top:,} partitions. "
                "The rest of each message's time is the Python send path and thread "
                "wake-ups, which both engines pay alike, so the segmented design's extra "
                "syncs show less here than the seeds' Java figures suggest."
            )
    lines.append(
        "- A ratio below 1x is where the segmented design wins; above 1x, where it "
        "loses. Consume, offsets_for_times and set-up/close times are in the table "
        "above; the segmented store pays its per-partition files at create and close."
    )
    lines.append("")
    return lines


def _profile_summary(text: str) -> str:
    """One line read off a profile: the function with the most own time and its share
    of the measured loop's cumulative time (the loop is _produce_loop or _timed)."""
    rows = [line.split(None, 5) for line in text.splitlines()[1:] if line.strip()]
    rows = [row for row in rows if len(row) == 6]
    if not rows:
        return "no profile rows"
    top = rows[0]
    loops = [float(r[3]) for r in rows if "_produce_loop" in r[5] or "_timed" in r[5]]
    share = f", {float(top[1]) / loops[0]:.0%} of the measured loop" if loops else ""
    return f"most own time in `{top[5]}` ({top[1]} s over {top[0]} calls{share})"


def _queues_claim(results_dir: str) -> list[str]:
    """The seeds' claim at 100,000 queues on both engines, from bench/queues.py's JSON."""
    try:
        with open(os.path.join(results_dir, "queues.json"), encoding="utf-8") as handle:
            cases = json.load(handle)["cases"]
    except FileNotFoundError:
        return []
    one = cases.get("commitlog/1", {}).get("readable_msg_per_s")
    lines = [
        "## The seeds' claim with many queues, both engines (`python -m bench.queues`)",
        "",
        "| engine | queues | readable msg/s | x of 1 CommitLog queue | open fds | RSS growth |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, case in cases.items():
        engine, queues = name.split("/")
        if "readable_msg_per_s" not in case:
            error = case["runs"][-1].get("error", "failed") if case.get("runs") else "failed"
            lines.append(f"| {engine} | {int(queues):,} | {error} | | | |")
            continue
        rate = case["readable_msg_per_s"]
        ratio = f"{rate / one:.2f}x" if one else "-"
        fds, rss = case["open_fds_growth"], case["rss_growth_mib"]
        lines.append(
            f"| {engine} | {int(queues):,} | {rate:,.0f} | {ratio} | +{fds:,.0f} | +{rss:.0f} MiB |"
        )
    return [*lines, ""]


def _value(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    unit = row.get("unit", "")
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:,.3g} {unit}"


def _status(row: dict[str, Any]) -> str:
    """MET or MISSED; "-" for a figure a benchmark reports beside its targets."""
    if row["target"] in ("(none)", "", None):
        return "-"
    return "MET" if row["met"] else "MISSED"


def _speed_targets(results_dir: str) -> list[str]:
    """The performance targets every other benchmark recorded (bench/targets.py)."""
    rows = targets.collect(results_dir)
    if not rows:
        return []
    lines = [
        "## Speed targets (each from its own benchmark, ratios measured in one run)",
        "",
        "| what | ours | compared with | theirs | ratio | target | met? | measured by |",
        "|---|---:|---|---:|---:|---|---|---|",
    ]
    for r in rows:
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}x"
        lines.append(
            f"| {r['row']} | {_value(r, 'value')} | {r.get('peer') or '-'} | "
            f"{_value(r, 'peer_value')} | {ratio} | {r['target']} | "
            f"{_status(r)} | `{r['command']}` {r['started'][:10]} |"
        )
    lines.append("")
    for r in rows:
        if r["met"] or _status(r) == "-":
            continue
        if r.get("profile"):
            head = f"Why missed: *{r['row']}*: where the time goes (from {r['source']}):"
            lines += [head, "", "```", r["profile"].rstrip(), "```", ""]
        else:
            lines += [f"Missed: *{r['row']}*: {r['source']} holds no profile.", ""]
    return lines


def generate(json_path: str, report_path: str, plots_dir: str) -> None:
    with open(json_path, encoding="utf-8") as handle:
        results = json.load(handle)
    os.makedirs(plots_dir, exist_ok=True)
    report_dir = os.path.dirname(os.path.abspath(report_path))
    plots = {
        "throughput": os.path.join(plots_dir, "throughput_vs_partitions.png"),
        "resources": os.path.join(plots_dir, "resources_vs_partitions.png"),
        "latency": os.path.join(plots_dir, "latency_cdf.png"),
        "peers": os.path.join(plots_dir, "peers.png"),
    }
    plot_throughput(results, plots["throughput"])
    plot_resources(results, plots["resources"])
    plot_latency(results, plots["latency"])
    plot_peers(results, plots["peers"])
    m = results["machine"]
    lines = [
        "# mqstore: the two designs side by side, and the peers",
        "",
        f"Generated by `bench/compare_report.py` from `{_rel(json_path, report_dir)}`; do not "
        "edit by hand. Reproduce with `make bench` (quick) or `make bench-full`.",
        "",
        f"- Command: `{results['command']}` ({results['mode']} mode, {results['repeats']} "
        f"interleaved repeats, seed {results['seed']}), started {results['started']}, "
        f"took {results['wall_s']:.0f} s.",
        f"- Machine: {m['cpu']}, {m['cpus']} CPUs, {m['mem_total']} RAM, {m['platform']}, "
        f"Python {m['python']}; temp dirs on {m['tmp_fs']}; open files limit "
        f"{m['open_files_limit']}, vm.max_map_count {m['max_map_count']}.",
        f"- CommitLog engine: {results['settings']['commitlog']}. Segmented engine: "
        f"{results['settings']['segmented']}. Both through KafkaProducer/KafkaConsumer.",
        "- Method: every repeat runs every case once, the two engines adjacent (A, B, A, B), "
        "each on a fresh store in a fresh temp dir, one store open at a time. Produce is "
        "measured over a time window (capped in messages) after an untimed warm-up of one "
        "message per partition (its cost, including the CommitLog dispatcher building that "
        "round's ConsumeQueue files, is in `set-up s`). `dispatch drain s`: after the window, "
        "the time the CommitLog dispatcher took to index the window's messages (readers see "
        "them only then; the produce figure counts acknowledged appends). Messages go "
        "round-robin over partitions with an explicit `partition=`. Cells are median [min .. max].",
        "",
        *_speed_targets(os.path.dirname(os.path.abspath(json_path))),
        "## Targets of the design comparison (one run)",
        "",
        *_targets_table(results),
        "",
    ]
    for t in results["targets"]:
        if not t["met"] and t["key"] in results.get("profiles", {}):
            lines += [f"Why missed: *{t['target']}*: "
                      f"{_profile_summary(results['profiles'][t['key']])}. cProfile of our "
                      "side (top functions by own time; the sync case profiles one of the 8 "
                      "producer threads while the others run):", "",
                      "```", results["profiles"][t["key"]], "```", ""]  # fmt: skip
    lines += [
        "## Design comparison",
        "",
        *_design_table(results),
        "",
        f"![throughput]({_rel(plots['throughput'], report_dir)})",
        "",
        "Key look-up (CommitLog `query_by_key`, 8 partitions, "
        f"{results['key_lookup']['runs'][0]['messages']:,} keyed messages): p50 "
        f"{_mr(results['key_lookup']['summary']['p50_us'])} us, p99 "
        f"{_mr(results['key_lookup']['summary']['p99_us'])} us, misses "
        f"{sum(r['misses'] for r in results['key_lookup']['runs'])}. The segmented baseline "
        "has no key index (as Kafka): a key look-up there is a full scan of the partitions.",
        "",
        f"![latency]({_rel(plots['latency'], report_dir)})",
        "",
        "## Resources against partitions (async; fds and maps are the store's additions, "
        "RSS is the whole process)",
        "",
        *_resource_table(results),
        "",
        f"![resources]({_rel(plots['resources'], report_dir)})",
        "",
        "## Open and recovery time after SIGKILL (1 KiB messages, 8 partitions, async)",
        "",
        "| engine | log MiB | open s | recovered messages | detected crash |",
        "|---|---:|---:|---:|---|",
        *[f"| {r['engine']} | {r['log_mib']} | {_mr(r['summary']['open_s'])} | "
          f"{_fmt(r['summary']['recovered_messages']['median'])} | "
          f"{all(x['recovered_from_crash'] for x in r['runs'])} |"
          for r in results["recovery"]],
        "",
        "## Peers (same workload, matched durability, best batch API)",
        "",
        *_peers_table(results),
        "",
        f"![peers]({_rel(plots['peers'], report_dir)})",
        "",
        *_claim(results),
        *_queues_claim(os.path.dirname(os.path.abspath(json_path))),
        *_noise(results),
    ]  # fmt: skip
    with open(report_path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines))
    print(f"wrote {report_path} and {len(plots)} plots under {plots_dir}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default="bench/results/compare.json")
    parser.add_argument("--report", default="bench/REPORT.md")
    parser.add_argument("--plots", default="bench/plots")
    args = parser.parse_args(argv)
    generate(args.json, args.report, args.plots)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
