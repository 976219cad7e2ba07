"""Scores a file of texts through ClassifyStream / TagStream: JSONL, CSV or plain text in, JSONL answers
out, resumable, with a progress bar.

    python -m qvi_client.batch --server localhost:8500 --model sentiment texts.jsonl answers.jsonl --gates

or from Python:

    from qvi_client import Client
    from qvi_client.batch import score_file

    with Client("localhost:8500") as client:
        summary = score_file(client, "sentiment", "texts.jsonl", "answers.jsonl", gates=True)
    print(summary)

Input: JSONL (one object per line with a `text` and, optionally, an `id`), CSV with a header (the same
columns), or any other file as plain text, one text per line. A text without an id is known by its
position among the file's texts (from 1). Ids must be unique: they are how a run resumes.

Output: one JSON object per text, in the order the answers come back: {"id", "model", "version",
"result"} with the result's fields under the proto's names, zeros written too (labels, spans, tokens with
α and β when asked), or {"id", "error": {"code", "message"}}. Each line is written whole and flushed, so a run that is stopped
(Ctrl-C, a lost machine) can be started again with the same command: ids whose answer is already in the
output are skipped, and texts that failed are tried again.

Many requests are in flight on one stream at once (`concurrency`); a request refused with UNAVAILABLE
or RESOURCE_EXHAUSTED is sent again after a backoff (the server's retry advice when it gives one), at
most `retries` times; a stream that breaks is opened again and its unanswered requests sent again.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import queue
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import grpc
from google.protobuf import json_format

from qvi_client.client import Client, QviError, _options, _priority, pb

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass
class BatchSummary:
    """What a run did: texts in the input, skipped (answered by an earlier run), answered, failed (by
    gRPC code name), requests sent again, seconds."""
    texts: int = 0
    skipped: int = 0
    answered: int = 0
    errors: Dict[str, int] = field(default_factory=dict)
    retries: int = 0
    elapsed: float = 0.0

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def __str__(self) -> str:
        done = self.answered + self.failed
        rate = done / self.elapsed if self.elapsed > 0 else 0.0
        errors = ", ".join(f"{code} {n}" for code, n in sorted(self.errors.items())) or "none"
        return (f"{self.texts} texts: {self.answered} answered, {self.failed} failed ({errors}), "
                f"{self.skipped} already in the output; {self.retries} requests sent again; "
                f"{self.elapsed:.1f} s, {rate:.1f} texts/s")


def read_texts(path: str, text_field: str = "text", id_field: str = "id",
               fmt: Optional[str] = None) -> List[Tuple[object, str]]:
    """(id, text) for each text of `path`: fmt "jsonl", "csv" or "text" (default: from the extension)."""
    fmt = fmt or _format_of(path)
    items: List[Tuple[object, str]] = []
    with open(path, encoding="utf-8", newline="" if fmt == "csv" else None) as f:
        if fmt == "csv":
            rows: Iterator = (row for row in csv.DictReader(f))
        elif fmt == "jsonl":
            rows = (_json_line(line, path, n) for n, line in enumerate(f, 1) if line.strip())
        else:
            rows = ({text_field: line.rstrip("\n")} for line in f)
        for n, row in enumerate(rows, 1):
            if row is None:
                continue
            if text_field not in row or not isinstance(row[text_field], str):
                raise ValueError(f"{path}: text {n} has no string field {text_field!r}")
            items.append((row.get(id_field, n), row[text_field]))
    seen = set()
    for item_id, _ in items:
        key = json.dumps(item_id)
        if key in seen:
            raise ValueError(f"{path}: the id {item_id!r} is given twice; ids must be unique to resume")
        seen.add(key)
    return items


def _format_of(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    return "jsonl" if ext in (".jsonl", ".ndjson", ".json") else "csv" if ext == ".csv" else "text"


def _json_line(line: str, path: str, n: int) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not JSON ({e})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{path}:{n}: want a JSON object per line")
    return row


def answered_ids(path: str) -> set:
    """The ids (as JSON) whose answer `path` holds. A last line cut short (the run was stopped while it
    was written) is removed."""
    done: set = set()
    if not os.path.exists(path):
        return done
    with open(path, "rb+") as f:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            f.truncate(end)
    for line in data[:end].decode("utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "result" in row:
            done.add(json.dumps(row.get("id")))
    return done


@dataclass
class _Chunk:
    ids: List[object]
    texts: List[str]
    attempts: int = 0


class _Run:
    """One score_file run: chunks go out over a stream and come back answered, failed, or to be sent
    again; a broken stream is opened again."""

    def __init__(self, client: Client, request_of, method: str, out, bar, concurrency: int, retries: int,
                 backoff: float, max_backoff: float, summary: BatchSummary):
        self.client, self.request_of, self.method, self.out, self.bar = client, request_of, method, out, bar
        self.concurrency, self.retries, self.backoff, self.max_backoff = concurrency, retries, backoff, max_backoff
        self.summary = summary
        self.work: "queue.Queue[_Chunk]" = queue.Queue()
        self.unresolved = 0
        self.timers: List[threading.Timer] = []

    def run(self, chunks: List[_Chunk]) -> None:
        for chunk in chunks:
            self.work.put(chunk)
        self.unresolved = len(chunks)
        broken = 0
        try:
            while self.unresolved > 0:
                if self._stream():
                    broken = 0
                    continue
                broken += 1
                if broken > self.retries:
                    raise QviError(grpc.StatusCode.UNAVAILABLE, "the stream broke too often", broken)
                time.sleep(self._pause(broken))
        finally:
            for timer in self.timers:
                timer.cancel()

    def _pause(self, attempt: int, advice_ms: int = 0) -> float:
        """Full jitter under an exponential ceiling, never sooner than the server's advice."""
        ceiling = min(self.backoff * (2 ** max(0, attempt - 1)), self.max_backoff)
        return max(advice_ms / 1000.0, random.uniform(0, ceiling))

    def _stream(self) -> bool:
        """One stream until every chunk is resolved (True) or it breaks (False; its unanswered chunks
        are queued again). A refusal of the stream itself that no retry mends raises QviError."""
        sent: Dict[int, _Chunk] = {}
        lock = threading.Lock()
        slots = threading.Semaphore(self.concurrency)
        stop = threading.Event()

        def requests():
            index = 0
            while not stop.is_set():
                if not slots.acquire(timeout=0.05):
                    continue
                chunk = None
                while chunk is None and not stop.is_set():
                    try:
                        chunk = self.work.get(timeout=0.05)
                    except queue.Empty:
                        pass
                if chunk is None:
                    return
                with lock:
                    sent[index] = chunk
                index += 1
                yield self.request_of(chunk)

        try:
            for answer in self.client._stream(self.method, requests()):
                with lock:
                    chunk = sent.pop(answer.index)
                slots.release()
                self._answer(chunk, answer)
                if self.unresolved == 0:
                    stop.set()  # the requests end, the server ends the stream
            return True
        except grpc.RpcError as e:
            code = e.code()
            if code not in RETRYABLE + (grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise QviError(code, e.details() or "") from None
            with lock:
                unanswered = list(sent.values())
                sent.clear()
            for chunk in unanswered:
                self.work.put(chunk)
            self.summary.retries += len(unanswered)
            return False
        finally:
            stop.set()

    def _answer(self, chunk: _Chunk, answer) -> None:
        if answer.WhichOneof("answer") == "response":
            r = answer.response
            for item_id, result in zip(chunk.ids, r.results):
                self._write({"id": item_id, "model": r.model.name, "version": r.model.version,
                             "result": json_format.MessageToDict(result, preserving_proto_field_name=True,
                                                                 always_print_fields_with_no_presence=True)})
            self.summary.answered += len(chunk.ids)
            return self._resolved(chunk)
        code = _CODES.get(answer.error.code, grpc.StatusCode.UNKNOWN)
        if code in RETRYABLE and chunk.attempts < self.retries:
            chunk.attempts += 1
            self.summary.retries += 1
            timer = threading.Timer(self._pause(chunk.attempts, answer.error.retry_after_ms), self.work.put, [chunk])
            timer.daemon = True
            self.timers.append(timer)
            timer.start()
            return
        name = code.name
        for item_id in chunk.ids:
            self._write({"id": item_id, "error": {"code": name, "message": answer.error.message}})
        self.summary.errors[name] = self.summary.errors.get(name, 0) + len(chunk.ids)
        self._resolved(chunk)

    def _write(self, row: dict) -> None:
        self.out.write(json.dumps(row, ensure_ascii=False) + "\n")

    def _resolved(self, chunk: _Chunk) -> None:
        self.out.flush()
        self.unresolved -= 1
        if self.bar is not None:
            self.bar.update(len(chunk.ids))


def score_file(client: Client, model: str, input_path: str, output_path: str, *, task: str = "classify",
               version: int = 0, top_k: int = 0, attention: bool = False, gates: bool = False, tokens: bool = False,
               truncation: str = "truncate", priority: str = "", text_field: str = "text", id_field: str = "id",
               fmt: Optional[str] = None, texts_per_request: int = 1, concurrency: int = 64, retries: int = 5,
               backoff: float = 0.1, max_backoff: float = 10.0, progress: Optional[bool] = None) -> BatchSummary:
    """Scores every text of `input_path` not yet answered in `output_path` (appended to); see the
    module's doc. progress: a tqdm bar on stderr (default: when stderr is a terminal)."""
    if task not in ("classify", "tag"):
        raise ValueError(f"task: {task!r}; want 'classify' or 'tag'")
    if texts_per_request < 1 or concurrency < 1 or retries < 0:
        raise ValueError("texts_per_request and concurrency must be at least 1, retries not negative")
    start = time.monotonic()
    items = read_texts(input_path, text_field, id_field, fmt)
    done = answered_ids(output_path)
    todo = [(i, t) for i, t in items if json.dumps(i) not in done]
    summary = BatchSummary(texts=len(items), skipped=len(items) - len(todo))
    chunks = [_Chunk([i for i, _ in todo[k:k + texts_per_request]], [t for _, t in todo[k:k + texts_per_request]])
              for k in range(0, len(todo), texts_per_request)]
    options = _options(top_k if task == "classify" else 0, attention, gates, tokens, truncation, None)
    spec = pb.ModelSpec(name=model, version=version)
    message = pb.ClassifyRequest if task == "classify" else pb.TagRequest

    def request_of(chunk: _Chunk):
        return message(model=spec, texts=chunk.texts, options=options, priority=_priority(priority))

    show = sys.stderr.isatty() if progress is None else progress
    bar = None
    if show:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), unit="text", file=sys.stderr, dynamic_ncols=True, desc=f"{task} {model}")
    try:
        with open(output_path, "a", encoding="utf-8") as out:
            method = "ClassifyStream" if task == "classify" else "TagStream"
            _Run(client, request_of, method, out, bar, concurrency, retries, backoff, max_backoff, summary).run(chunks)
    finally:
        if bar is not None:
            bar.close()
        summary.elapsed = time.monotonic() - start
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="qvi-batch", description="Score a file of texts with QVI Serve, resumably.")
    p.add_argument("input", help="JSONL ({'id', 'text'} per line), CSV with a header, or plain text (a text per line)")
    p.add_argument("output", help="JSONL answers, appended to; a run again skips the ids answered in it")
    p.add_argument("--server", default="localhost:8500")
    p.add_argument("--model", required=True)
    p.add_argument("--task", choices=["classify", "tag"], default="classify")
    p.add_argument("--version", type=int, default=0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--attention", action="store_true", help="α per token")
    p.add_argument("--gates", action="store_true", help="β per token (QVI models)")
    p.add_argument("--tokens", action="store_true", help="the tokens, without explanations")
    p.add_argument("--priority", default="", choices=["", "high", "normal", "low"])
    p.add_argument("--text-field", default="text")
    p.add_argument("--id-field", default="id")
    p.add_argument("--format", choices=["jsonl", "csv", "text"], help="default: from the input's extension")
    p.add_argument("--texts-per-request", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight on the stream")
    p.add_argument("--retries", type=int, default=5)
    p.add_argument("--tls-ca", help="PEM CA bundle of the server's certificate: connect with TLS")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    try:
        with Client(a.server, tls=bool(a.tls_ca), root_certificates=a.tls_ca) as client:
            summary = score_file(client, a.model, a.input, a.output, task=a.task, version=a.version, top_k=a.top_k,
                                 attention=a.attention, gates=a.gates, tokens=a.tokens, priority=a.priority,
                                 text_field=a.text_field, id_field=a.id_field, fmt=a.format,
                                 texts_per_request=a.texts_per_request, concurrency=a.concurrency, retries=a.retries,
                                 progress=False if a.no_progress else None)
    except (QviError, ValueError, OSError) as e:
        print(f"qvi-batch: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("qvi-batch: stopped; the same command resumes", file=sys.stderr)
        return 130
    print(summary, file=sys.stderr)
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
