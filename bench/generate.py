"""Generate realistic agent workspaces for benchmarks: daily logs, project notes, a MEMORY.md.

Each file is ~2 KB of Markdown (headings, bullet notes, a code fence now and then) with unique
ids (commit-like hashes, ticket numbers) so exact-match queries have exactly one answer.
Deterministic for a given seed.

    python bench/generate.py OUT_DIR N_FILES [--seed 7] [--layout folders|flat]
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
from pathlib import Path

WORDS = """agent memory index search deploy staging release branch review meeting decision database sqlite
vector embedding latency budget customer invoice migration schema rollback incident alert pager config
token chunk overlap heading daily log project roadmap milestone blocker dependency upgrade python rust
server socket client timeout retry backoff cache eviction snapshot backup restore cluster node replica
leader follower quorum partition shard tenant quota billing report dashboard metric trace span sample
prompt context window summary note research paper benchmark dataset evaluation recall precision ranking
garden recipe travel flight hotel train ticket passport birthday gift family friend doctor dentist gym
""".split()
PEOPLE = ["Dana", "Ravi", "Mei", "Tomás", "Aisha", "Jonas", "Priya", "Kenji", "Lena", "Omar"]
SYLLABLES = "ka lo mi ne ru sa ti vo ze pa qui bre dra fli gno plu sto tra ven mor lin dax cor pel hum".split()


FUNCTION_WORDS = "the a to of and in is for on with that it was we this at be by from as are not".split()


def _vocabulary(size: int = 8000) -> list[str]:
    """Zipf ranks as in real notes: function words, then domain words among a long tail of made-up words."""
    rng = random.Random(0)
    tail: set[str] = set()
    while len(tail) < size:
        tail.add("".join(rng.choices(SYLLABLES, k=rng.randint(2, 4))))
    rest = WORDS + sorted(tail)
    head, body = rest[:600], rest[600:]
    rng.shuffle(head)
    return FUNCTION_WORDS + head + body


VOCABULARY = _vocabulary()
ZIPF = [1.0 / (rank + 1) ** 1.05 for rank in range(len(VOCABULARY))]


def sentence(rng: random.Random, lo: int = 6, hi: int = 16) -> str:
    words = rng.choices(VOCABULARY, weights=ZIPF, k=rng.randint(lo, hi))
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def daily_log(rng: random.Random, day: dt.date, serial: int) -> str:
    out = [f"# {day.isoformat()}", ""]
    while sum(len(line) + 1 for line in out) < 1900:
        out.append(f"## {rng.randint(7, 22):02}:{rng.choice(['00', '15', '30', '45'])} {sentence(rng, 2, 4)[:-1]}")
        for _ in range(rng.randint(2, 5)):
            item = sentence(rng)
            roll = rng.random()
            if roll < 0.2:
                item += f" Commit {rng.getrandbits(28):07x}."
            elif roll < 0.35:
                item += f" Ticket T-{serial}-{rng.randint(100, 999)}."
            elif roll < 0.45:
                item += f" Asked {rng.choice(PEOPLE)} about it."
            out.append(f"- {item}")
        if rng.random() < 0.1:
            out += ["```", f"clawmem search \"{rng.choice(WORDS)} {rng.choice(WORDS)}\"", "```"]
        out.append("")
    return "\n".join(out)


def project_note(rng: random.Random, serial: int) -> str:
    out = [f"# Project {serial}: {sentence(rng, 2, 4)[:-1]}", "", "## Goal", sentence(rng, 10, 25), "", "## Status"]
    while sum(len(line) + 1 for line in out) < 1900:
        out.append(f"- {sentence(rng)} Owner {rng.choice(PEOPLE)}, id P{serial}-{rng.getrandbits(20):05x}.")
    return "\n".join(out) + "\n"


def generate(out: Path, n_files: int, seed: int = 7, layout: str = "folders") -> Path:
    """`layout` "folders": daily logs in year folders and project notes (every fourth file) in their own;
    "flat": every file a daily log, `memory/YYYY-MM-DD.md` in one folder, as OpenClaw keeps them."""
    rng = random.Random(seed)
    (out / "memory").mkdir(parents=True, exist_ok=True)
    (out / "MEMORY.md").write_text("# MEMORY\n\n## Facts\n" + "".join(f"- {sentence(rng)}\n" for _ in range(30)))
    start = dt.date(2020, 1, 1) if layout == "folders" else dt.date(2026, 11, 28) - dt.timedelta(days=n_files - 2)
    for i in range(n_files - 1):
        if layout == "flat":
            day = start + dt.timedelta(days=i)
            path = out / "memory" / f"{day.isoformat()}.md"
            text = daily_log(rng, day, i)
        elif i % 4 == 3:
            path = out / "memory" / "projects" / f"p{i // 400}" / f"project-{i}.md"
            text = project_note(rng, i)
        else:
            day = start + dt.timedelta(days=i)
            path = out / "memory" / str(day.year) / f"{day.isoformat()}-{i}.md"
            text = daily_log(rng, day, i)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("n_files", type=int)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--layout", choices=("folders", "flat"), default="folders",
                        help="flat: every note a daily log in memory/YYYY-MM-DD.md (OpenClaw's layout)")
    args = parser.parse_args()
    generate(args.out, args.n_files, args.seed, args.layout)


if __name__ == "__main__":
    main()
