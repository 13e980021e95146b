"""Packed shards and object storage (results ``storage``)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from .base import Results, Section, in_order, num, ratio, table
from .plots import barh, figure, finish


def _storage_place(settings: Mapping[str, Any], where: str) -> str:
    def shards(n: int) -> str:
        return f"{n} shard{'s' * (n != 1)}"

    if where == "local":
        return f"local shards ({settings['files']} files, {shards(settings['shards'])})"
    return (f"S3, {settings['delay_ms']:g} ms a request ({settings['remote_files']} files, "
            f"{shards(settings['remote_shards'])})")


def storage_table(results: Results) -> str:
    data = results["storage"]
    body, last = [], None
    for row in data["rows"]:
        if row["where"] == "local" and "producer" in row["approach"]:
            continue  # fixed counts against auto: the epochs section's question (they stay in the results)
        place = _storage_place(data["settings"], row["where"])
        epoch = num(row["median_s"], 3 if row["where"] == "local" else 2)  # as many decimals as the run resolves
        body.append([place if place != last else "", row["approach"], epoch,
                     num(row["files_per_s"], 0), ratio(row["vs_loop"]), num(row["peak_rss_rise_mb"], 1)])
        last = place
    return table(["data", "approach", "epoch s", "files/s", "vs loop", "peak RSS rise MiB"], body)


def storage_reading(results: Results) -> str:
    settings = results["storage"]["settings"]
    cpu = settings.get("request_cpu_ms")
    if not cpu:
        return ""
    text = (f"A request cost {num(sum(cpu.values()), 1)} ms of CPU (server, proxy and client all on these 2 "
            f"cores): a ceiling near {ratio(settings['request_cap'])} the per-member loop for any thread count")
    caps = {key[len("block"):]: cap for key, cap in settings.get("cpu_cap", {}).items() if key.startswith("block")}
    if caps:
        text += (", and with `read_block` " + ", ".join(f"{ratio(c['cap'])} (blocks of {n})" for n, c in caps.items()))
    return text + "."


def storage_plot(results: Results) -> Any:
    data = results["storage"]
    places = in_order(r["where"] for r in data["rows"])
    fig, axes = figure(1, len(places), width=12, height=3.4)
    for ax, where in zip(axes.flat, places):
        rows = [r for r in data["rows"] if r["where"] == where]
        barh(ax, [textwrap.fill(r["approach"].replace("`", ""), 40, break_long_words=False) for r in rows],
             [r["vs_loop"] for r in rows],
             title=_storage_place(data["settings"], where), xlabel="speed against the loop (log; higher is faster)",
             log=True)
    return finish(fig)


STORAGE = Section(
    name="storage", title="Packed shards and object storage", sources={"storage": None},
    about="FSDD packed into tar shards (`audiobuffer pack`): epochs by index (byte ranges) and of the streamed shards, "
          "against `soundfile.read` over the files; then on S3 (moto on 127.0.0.1) behind a proxy that holds each "
          "request 20 ms, against one-thread loops that GET each member's bytes or each shard whole. In turns.",
    table=storage_table, reading=storage_reading, plot=storage_plot,
    alt="each approach's speed against the loop, local shards and S3")
