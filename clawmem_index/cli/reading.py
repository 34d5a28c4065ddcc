"""`clawmem` commands that read: search, get, context, status."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from clawmem_index.cli.base import (
    argument_text,
    cli,
    ctx_of,
    global_options,
    run,
)


@cli.command()
@global_options
@click.argument("query", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the socket API's search object as JSON.")
@click.option("-n", "--max-results", type=click.IntRange(1, 1000), help="How many results (default 6).")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), help="Ranking mode (default hybrid).")
@click.option("--min-score", type=click.FloatRange(0.0, 1.0), help="Drop results scoring below this (default 0.2).")
@click.option("--path-prefix", metavar="PREFIX", help="Only results whose path starts with PREFIX.")
@click.option("--source", type=click.Choice(["memory", "sessions"]), help="Only memory files, or only transcripts.")
@click.option("--since", metavar="DATE", help="Only chunks dated on or after DATE (YYYY-MM-DD).")
@click.option("--before", metavar="DATE", help="Only chunks dated before DATE (YYYY-MM-DD).")
@click.option("--explain", is_flag=True, help="Say how each result got its place (keyword and vector rank and score,"
                                               " closeness to the days QUERY names, fused score, decay, MMR) and how"
                                               " QUERY was read.")
@click.option("--now", metavar="DATE", help="The day relative dates in QUERY (yesterday, three days ago, last"
                                           " Monday) count from (YYYY-MM-DD) [default: today].")
@click.option("--workspace-set", metavar="NAMES", help="A shared index (index_backend postgres): search these"
                                                        " workspaces, comma-separated (e.g. alpha,beta).")
def search(query: tuple[str, ...], as_json: bool, max_results: int | None, mode: str | None,
           min_score: float | None, path_prefix: str | None, source: str | None, since: str | None,
           before: str | None, explain: bool, workspace_set: str | None, now: str | None, **kwargs: Any) -> None:
    """Search the memory for QUERY.

    Dated chunks are those of daily files (the YYYY-MM-DD in their name, or year/month/day folders:
    memory/2026/11/25.md) and of transcripts; a date bound leaves undated ones (MEMORY.md) out.
    """
    ctx = ctx_of(kwargs)
    _one_blas_thread()

    def action() -> None:
        prefix = argument_text(path_prefix) if path_prefix is not None else None
        answer = ctx.client().search(" ".join(map(argument_text, query)), max_results=max_results, min_score=min_score,
                                     mode=mode, path_prefix=prefix,
                                     source=source, since=since, before=before, explain=explain,
                                     workspaces=_workspace_names(workspace_set), now=now)
        if _printed_as_json(answer, as_json):
            return
        results = answer["results"]
        if not results:
            click.echo("no results", err=True)
        for r in results:
            where = f"{r['workspace']}:" if "workspace" in r and workspace_set else ""
            click.echo(click.style(f"{where}{r['path']}:{r['start_line']}-{r['end_line']}", bold=True)
                       + f"  score {r['score']:.3f}")
            if r.get("explain"):
                click.echo(f"    ({_explained(r['explain'])})")
            for line in str(r["snippet"]).splitlines()[:8]:
                click.echo(f"    {line}")
            click.echo("")

    run(action)


def _printed_as_json(answer: dict[str, Any], as_json: bool) -> bool:
    """`--json`: the answer, whole, on stdout (True). Otherwise what it does not cover, on stderr: its warning,
    changes not yet indexed, workspaces it could not read (False: the caller prints the answer itself)."""
    if as_json:
        click.echo(json.dumps(answer, ensure_ascii=False))
        return True
    if answer.get("warning"):
        click.echo(f"clawmem: note: {answer['warning']}", err=True)
    _note_reading(answer)
    _note_staleness(answer)
    _note_unreadable(answer)
    return False


def _workspace_names(workspace_set: str | None) -> list[str] | None:
    """`--workspace-set alpha,beta` as the names a shared index's search takes (None: this workspace)."""
    if not workspace_set:
        return None
    return [name.strip() for name in argument_text(workspace_set).split(",") if name.strip()]


def _note_reading(answer: dict[str, Any]) -> None:
    """Say on stderr how the query was read when not as typed: the days it names, the words its typos meant."""
    read = answer.get("query") or {}
    for date in read.get("dates", []):
        days = date["from"] if date["from"] == date["to"] else f"{date['from']} to {date['to']}"
        click.echo(f"clawmem: note: read {date['text']!r} as {days} (notes dated near it first)", err=True)
    for typo in read.get("corrected", []):
        click.echo(f"clawmem: note: read {typo['word']!r} as " + " or ".join(map(repr, typo["read_as"])), err=True)


def _note_staleness(answer: dict[str, Any]) -> None:
    """Say on stderr what the answer does not cover yet (the JSON answer carries the same counts)."""
    from clawmem_index.api import coverage_notes

    for note in coverage_notes(answer):
        click.echo(f"clawmem: note: {note}", err=True)


def _note_unreadable(answer: dict[str, Any]) -> None:
    if answer.get("unreadable_workspaces"):
        click.echo("clawmem: note: not in the shared index or not readable here: "
                   + ", ".join(answer["unreadable_workspaces"]), err=True)


def _explained(how: dict[str, Any]) -> str:
    """`keyword #2 0.830, vector #5 0.612, weighted 0.693, decay x0.81, MMR #4 -> #2` for people."""
    parts = [f"{side} " + (f"#{how[f'{key}_rank']} {how[f'{key}_score']:.3f}" if how.get(f"{key}_rank") else "-")
             for side, key in (("keyword", "keyword"), ("vector", "vector"))]
    if "date_closeness" in how:
        parts.append(f"date {how['date_closeness']:.2f}")
    parts.append(f"{how['fusion']} {how['fused_score']:.3f}")
    if "decay_factor" in how:
        parts.append(f"decay x{how['decay_factor']:.2f}")
    if "mmr" in how:
        parts.append(f"MMR #{how['mmr']['place_before']} -> #{how['mmr']['place_after']}")
    return ", ".join(parts)


@cli.command()
@global_options
@click.argument("path")
@click.option("--from", "start", type=click.IntRange(min=1), help="First line to print (1-based).")
@click.option("--lines", type=click.IntRange(min=1), help="How many lines to print.")
def get(path: str, start: int | None, lines: int | None, **kwargs: Any) -> None:
    """Print a memory file, or a range of its lines."""
    ctx = ctx_of(kwargs)

    def action() -> None:
        from clawmem_index.errors import QueryError
        from clawmem_index.sources.files import path_key

        client, key = ctx.client(), path_key(path)
        first, left = start or 1, lines
        while True:  # a large file comes in bounded pieces: print each, ask for the next
            answer = client.get(key, start=first, lines=left)
            if "file_lines" in answer:
                raise QueryError(f"{answer['path']} has {answer['file_lines']} line(s): --from {first} is past its"
                                 " end")
            text = str(answer["text"])
            if answer.get("lines"):
                click.echo(text)
            if not answer.get("truncated") or not answer.get("next_from"):
                return
            if left is not None:
                left -= int(answer["next_from"]) - first
                if left <= 0:
                    return
            first = int(answer["next_from"])

    run(action)


@cli.command()
@global_options
@click.argument("query", nargs=-1, required=True)
@click.option("--budget", type=click.IntRange(min=0), metavar="TOKENS",
              help="Most tokens the block may take (tiktoken, the index's tokenizer) [default 1500:"
                   " search.context_budget].")
@click.option("--json", "as_json", is_flag=True, help="Print the socket API's context object as JSON.")
@click.option("-n", "--max-results", type=click.IntRange(1, 1000), help="How many search results to draw on.")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "vector"]), help="Ranking mode (default hybrid).")
@click.option("--min-score", type=click.FloatRange(0.0, 1.0), help="Leave out results scoring below this.")
@click.option("--path-prefix", metavar="PREFIX", help="Only files whose path starts with PREFIX.")
@click.option("--since", metavar="DATE", help="Only chunks dated on or after DATE (YYYY-MM-DD).")
@click.option("--before", metavar="DATE", help="Only chunks dated before DATE (YYYY-MM-DD).")
@click.option("--workspace-set", metavar="NAMES", help="A shared index (index_backend postgres): draw on these"
                                                        " workspaces, comma-separated (e.g. alpha,beta).")
@click.option("--now", metavar="DATE", help="The day relative dates in QUERY (yesterday, three days ago, last"
                                           " Monday) count from (YYYY-MM-DD) [default: today].")
def context(query: tuple[str, ...], budget: int | None, as_json: bool, max_results: int | None, mode: str | None,
            min_score: float | None, path_prefix: str | None, since: str | None, before: str | None,
            workspace_set: str | None, now: str | None, **kwargs: Any) -> None:
    """Print the memory block for a prompt: the best lines for QUERY, grouped by file, within a token budget.

    Each range is labelled `### PATH#LSTART-LEND`; whole lines only. Nothing is printed (and a note
    goes to stderr) when nothing matches or nothing fits.
    """
    ctx = ctx_of(kwargs)
    _one_blas_thread()

    def action() -> None:
        answer = ctx.client().context(" ".join(map(argument_text, query)), budget=budget, max_results=max_results,
                                      min_score=min_score, mode=mode,
                                      path_prefix=argument_text(path_prefix) if path_prefix is not None else None,
                                      since=since, before=before, workspaces=_workspace_names(workspace_set),
                                      now=now)
        if _printed_as_json(answer, as_json):
            return
        if answer["text"]:
            click.echo(answer["text"])
        elif answer["hits"]:
            click.echo(f"nothing fits in {answer['budget']} tokens", err=True)
        else:
            click.echo("no results", err=True)

    run(action)


# `status --check`: how fresh the index is, as the exit status (a health check need not parse JSON).
CHECK_FRESH, CHECK_NO_INDEX, CHECK_STALE, CHECK_BROKEN = 0, 3, 4, 5


@cli.command()
@global_options
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON.")
@click.option("--check", is_flag=True,
              help="Exit 0 if fresh, 3 if there is no index, 4 if work is pending (it catches up by itself),"
                   " 5 if it cannot catch up (provider cannot start, last sync or embedding failed).")
def status(as_json: bool, check: bool, **kwargs: Any) -> None:
    """Show what is indexed, with which model, and how fresh it is."""
    ctx = ctx_of(kwargs)

    def action() -> None:
        data = ctx.client().status()
        if as_json:
            click.echo(json.dumps(data, ensure_ascii=False))
        else:
            _print_fields(data)
        if check:
            sys.exit(freshness_code(data))

    run(action)


def freshness_code(data: dict[str, Any]) -> int:
    """The `status --check` exit status of a status object."""
    if not data.get("index_exists", True):
        return CHECK_NO_INDEX
    daemon = data.get("daemon") or {}
    if (data.get("configured_provider") == "unavailable" or data.get("last_error") or data.get("embedding_error")
            or daemon.get("last_error") or daemon.get("embedding_error")):
        return CHECK_BROKEN
    return CHECK_FRESH if data.get("fresh") else CHECK_STALE


def _print_fields(data: dict[str, Any], indent: int = 0) -> None:
    """`key value` lines for people: nested objects and lists indented under their key, "-" for nothing."""
    for key, value in data.items():
        if key in ("fingerprint", "last") or value in ([], {}):
            continue
        if isinstance(value, dict):
            click.echo(f"{'':>{indent}}{key}:")
            _print_fields(value, indent + 2)
        elif isinstance(value, list):
            click.echo(f"{'':>{indent}}{key}:")
            for item in value:
                click.echo(f"{'':>{indent + 2}}- {_plain(item)}")
        else:
            click.echo(f"{'':>{indent}}{key:<{22 - indent}} {_plain(value)}")


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items())
    return str(value)


def _one_blas_thread() -> None:
    """A search answered here multiplies one query vector by a few thousand at most: the thread pool numpy's
    OpenBLAS starts at its import cost a search ~0.1 s of CPU, more than the vector search. Unless the user
    set it, one thread (before numpy is imported; a daemon answering instead imports nothing)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
