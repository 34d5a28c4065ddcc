"""Date questions on daily notes that only their dates tell apart: is the right day's note first?

    python bench/bench_dates.py [--days 120] [--model PATH.gguf] [--work DIR] [--out bench/out/dates.json]

A workspace of one daily note a day (memory/YYYY-MM-DD.md) for `--days` days before NOW, each the
same template about one of five topics in turn, so every topic is written up on many days and only
the date says which. Each note is asked about in every way a person names its day that applies:
"yesterday", "the day before yesterday", "N days ago" (digits and words), "last <weekday>" (within
the last week), "a fortnight ago", "on the <Nth>" (the last month's days), "the week of <Month> <day>"
(the week's Monday named, asked only where the topic comes once that week), "on <Month> <day>",
"<day> <Month> <year>", and the ISO date, as "what did we say about the <topic> <date>?" with `now` = NOW.
Measured: the share of questions whose first result is that day's note, per way of naming it and
overall, in keyword and hybrid search (the default local model), with the date prior at its default
weight and off (`date_weight` 0: the date is words).
Latency: each search's time, p50 / p95 (query embedding excluded).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clawmem_index.config import load_settings, with_overrides  # noqa: E402
from clawmem_index.embeddings.base import ProviderBase  # noqa: E402
from clawmem_index.engine.core import MemoryIndex  # noqa: E402
from clawmem_index.search.ranking import SearchRequest, run_search  # noqa: E402

NOW = dt.date(2026, 11, 28)
TOPICS = ["staging deploy", "quarterly budget", "hiring plan", "database migration", "customer escalation"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


class Remembered(ProviderBase):
    """The provider, each query's vector computed once (the timing leaves the model out)."""

    def __init__(self, provider: Any) -> None:
        self.provider, self.info, self.seen = provider, provider.info, {}

    def embed_query(self, text: str) -> Any:
        if text not in self.seen:
            self.seen[text] = self.provider.embed_query(text)
        return self.seen[text]

    def embed_documents(self, texts: Any) -> Any:
        return self.provider.embed_documents(texts)


def note(day: dt.date, topic: str) -> str:
    return (f"# {day.isoformat()}\n\n## Standup\n\nWe went over the {topic} again. The team agreed on the next"
            f" steps for the {topic} and wrote them down.\n\n## Notes\n\n- The {topic} is on track.\n")


def workspace(root: Path, days: int) -> dict[dt.date, str]:
    (root / "memory").mkdir(parents=True, exist_ok=True)
    topics: dict[dt.date, str] = {}
    for back in range(1, days + 1):
        day = NOW - dt.timedelta(days=back)
        topics[day] = TOPICS[back % len(TOPICS)]
        (root / "memory" / f"{day.isoformat()}.md").write_text(note(day, topics[day]))
    return topics


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def namings(day: dt.date, topics: dict[dt.date, str]) -> dict[str, str]:
    """Each way of naming `day` from NOW that applies to it."""
    back = (NOW - day).days
    out = {"month day": f"on {day:%B} {day.day}", "day month year": f"on {day.day} {day:%B} {day.year}",
           "iso": f"on {day.isoformat()}"}
    if back == 1:
        out["yesterday"] = "yesterday"
    if back == 2:
        out["day before yesterday"] = "the day before yesterday"
    if 2 <= back <= 30:
        out["N days ago"] = f"{back} days ago"
    if 2 <= back < len(NUMBERS):
        out["N days ago (words)"] = f"{NUMBERS[back]} days ago"
    if 1 <= back <= 7:
        out["last weekday"] = f"last {WEEKDAYS[day.weekday()]}"
    if back == 14:
        out["a fortnight ago"] = "a fortnight ago"
    if (day.year, day.month) == (NOW.year, NOW.month) or (day.day > NOW.day and back < 31):
        out["on the Nth"] = f"on the {ordinal(day.day)}"
    monday = day - dt.timedelta(days=day.weekday())
    week = [monday + dt.timedelta(days=i) for i in range(7)]
    if sum(topics.get(d) == topics[day] for d in week) == 1:
        out["the week of"] = f"the week of {monday:%B} {monday.day}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=120)
    parser.add_argument("--model", default=None)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "dates.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="clawmem-dates-"))
    topics = workspace(work / "ws", args.days)
    questions = [(kind, f"what did we say about the {topic} {named}?", day)
                 for day, topic in sorted(topics.items()) for kind, named in namings(day, topics).items()]
    out: dict[str, Any] = {"days": args.days, "questions": len(questions), "now": NOW.isoformat()}
    for mode in ("bm25", "hybrid"):
        overrides: dict[str, Any] = {"index": str(work / f"{mode}.sqlite"),
                                     "embedding.provider": "none" if mode == "bm25" else "local"}
        if args.model and mode == "hybrid":
            overrides["embedding.local_model"] = args.model
        index = MemoryIndex(load_settings(workspace=work / "ws", overrides=overrides, environ={}),
                            pending_files=lambda: 0)
        index.sync()
        provider = Remembered(index.provider) if mode == "hybrid" else None
        for weight in (None, 0.0):
            name = f"{mode}" + ("" if weight is None else "-no-dates")
            settings = index.settings.search if weight is None else \
                with_overrides(index.settings, search={"date_weight": weight}).search
            first: dict[str, list[int]] = defaultdict(list)
            took: list[float] = []
            for kind, question, day in questions:
                if provider is not None:
                    provider.embed_query(question)  # outside the timing: query embedding is excluded
                started = time.perf_counter()
                outcome = run_search(index.reader(), provider, SearchRequest(question, mode=mode, now=NOW.isoformat()),
                                     settings)
                took.append(time.perf_counter() - started)
                right = bool(outcome.results) and outcome.results[0].path == f"memory/{day.isoformat()}.md"
                first[kind].append(int(right))
                first["overall"].append(int(right))
            took.sort()
            out[name] = {kind: {"right_day_first": round(statistics.mean(v), 4), "questions": len(v)}
                         for kind, v in sorted(first.items())}
            out[name]["query_ms_p50"] = round(1000 * statistics.median(took), 2)
            out[name]["query_ms_p95"] = round(1000 * took[int(0.95 * (len(took) - 1))], 2)
            print(name, json.dumps(out[name]), flush=True)
        index.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
