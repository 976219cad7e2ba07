"""A typed client of qvi.serving.v1.Inference: Classify and Tag with their explanations.

    from qvi_client import Client

    with Client("localhost:8500") as client:
        result = client.classify("sentiment", ["A gorgeous, moving film."], attention=True, gates=True)
        print(result[0].label, [(t.text, t.attention, t.gate) for t in result[0].tokens])

The same calls go over HTTP/JSON with protocol="http" and the server's HTTP port:

    with Client("localhost:8501", protocol="http") as client: ...

Every call has a deadline (`timeout`, seconds). A call that gets UNAVAILABLE (the server is starting,
draining, or the version is loading) is tried again with exponential backoff, `retries` times, within
the same deadline. Any other error, and UNAVAILABLE once the retries are spent, raises QviError with
the gRPC code and the server's message (which names the field and the limit); over HTTP the code is the
one the HTTP status stands for (404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, ...).
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, Union

import grpc
from google.protobuf import json_format

from qvi_client._proto.qvi.serving.v1 import inference_pb2 as pb
from qvi_client._proto.qvi.serving.v1 import inference_pb2_grpc as pb_grpc

log = logging.getLogger("qvi_client")

_REDUCTIONS = {"none": pb.LAYER_REDUCTION_NONE, "mean_heads": pb.LAYER_REDUCTION_MEAN_HEADS,
               "mean_all": pb.LAYER_REDUCTION_MEAN_ALL}
_TRUNCATION = {"truncate": pb.TRUNCATION_POLICY_TRUNCATE, "error": pb.TRUNCATION_POLICY_ERROR}


class QviError(Exception):
    """A call the server (or the connection) answered with an error."""

    def __init__(self, code: grpc.StatusCode, message: str, attempts: int = 1):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.attempts = attempts


@dataclass(frozen=True)
class Token:
    """One token the model read. start/end are code points of the text (text[start:end] == self.text)."""
    text: str
    start: int
    end: int
    byte_start: int
    byte_end: int
    normalized: str
    id: int
    attention: Optional[float] = None  # α, when asked for
    gate: Optional[float] = None       # β, when asked for (QVI models)
    tag: str = ""                      # Tag only
    sentence_attention: Optional[float] = None
    sentence_gate: Optional[float] = None
    lambda_q: Optional[float] = None
    lambda_k: Optional[float] = None
    # subwords=True (a sub-word model): the word this sub-word belongs to, -1 for a special token such as
    # [CLS]; `normalized` is its vocabulary spelling ("##ing"). None for a word.
    word: Optional[int] = None


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class Span:
    """An entity: text[start:end] == self.text (code points); tokens[token_start:token_end] are its tokens."""
    label: str
    start: int
    end: int
    text: str
    score: float
    byte_start: int
    byte_end: int
    token_start: int
    token_end: int


@dataclass(frozen=True)
class LayerMap:
    """One layer's and head's maps (-1 where averaged); attention is T x T, row-major."""
    layer: int
    head: int
    gates: List[float]
    lambda_q: List[float]
    lambda_k: List[float]
    attention: List[float]


@dataclass(frozen=True)
class Classification:
    labels: List[LabelScore]  # best first
    tokens: List[Token]       # when any per-token output was asked for
    truncated: bool
    num_tokens: int           # in the whole text, before truncation
    layers: List[LayerMap] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.labels[0].label

    @property
    def score(self) -> float:
        return self.labels[0].score


@dataclass(frozen=True)
class Tagging:
    spans: List[Span]
    tokens: List[Token]
    truncated: bool
    num_tokens: int
    layers: List[LayerMap] = field(default_factory=list)


@dataclass(frozen=True)
class Answer:
    """A call's answer: the model and version that answered, and one result per text, in order."""
    model: str
    version: int
    request_id: str
    results: list

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i):
        return self.results[i]

    def __iter__(self) -> Iterator:
        return iter(self.results)


@dataclass(frozen=True)
class VersionState:
    version: int
    state: str   # "LOADING", "READY", "FAILED", "UNLOADING"
    reason: str


@dataclass(frozen=True)
class ModelState:
    name: str
    versions: List[VersionState]


def _token(t) -> Token:
    def opt(name):
        return getattr(t, name) if t.HasField(name) else None
    return Token(t.text, t.start, t.end, t.byte_start, t.byte_end, t.normalized, t.id, opt("attention"),
                 opt("gate"), t.tag, opt("sentence_attention"), opt("sentence_gate"), opt("lambda_q"), opt("lambda_k"),
                 opt("word"))


def _layers(layers) -> List[LayerMap]:
    return [LayerMap(m.layer, m.head, list(m.gates), list(m.lambda_q), list(m.lambda_k), list(m.attention))
            for m in layers]


# The gRPC code an HTTP status of qvi-server's stands for (its HTTP port maps codes to statuses).
_HTTP_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
               403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
               405: grpc.StatusCode.UNIMPLEMENTED, 409: grpc.StatusCode.ABORTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
               429: grpc.StatusCode.RESOURCE_EXHAUSTED, 431: grpc.StatusCode.RESOURCE_EXHAUSTED,
               499: grpc.StatusCode.CANCELLED, 501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE,
               504: grpc.StatusCode.DEADLINE_EXCEEDED}


class _HttpError(grpc.RpcError):
    """An HTTP answer that is not 200, in the shape of a gRPC error (code(), details())."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _HttpStub:
    """Classify, Tag and ListModels over qvi-server's HTTP/JSON port, called as the gRPC stub's methods
    are: the same request messages, sent in protobuf's JSON mapping. One keep-alive connection per
    thread."""

    def __init__(self, target: str, api_key: Optional[str] = None):
        self._api_key = api_key
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"target: {target!r}; want host:port")
        self._host, self._port = host, int(port)
        self._local = threading.local()
        self._connections: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _request(self, method: str, path: str, body: Optional[bytes], timeout: float) -> bytes:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        for attempt in (1, 2):  # a keep-alive connection the server closed meanwhile is opened again, once
            conn = self._connection(timeout)
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                break
            except TimeoutError:
                conn.close()
                raise _HttpError(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed") from None
            except (ConnectionError, http.client.HTTPException) as e:
                conn.close()
                if attempt == 2:
                    raise _HttpError(grpc.StatusCode.UNAVAILABLE, f"HTTP: {e}") from None
        if response.status != 200:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                message = data.decode("utf-8", "replace")[:500]
            raise _HttpError(_HTTP_CODES.get(response.status, grpc.StatusCode.UNKNOWN),
                             message) from None
        return data

    def _infer(self, verb: str, request, reply, timeout: float):
        path = f"/v1/models/{request.model.name}"
        if request.model.version:
            path += f"/versions/{request.model.version}"
        body = pb.ClassifyRequest() if verb == "classify" else pb.TagRequest()
        body.CopyFrom(request)
        body.ClearField("model")  # the path names it
        data = self._request("POST", f"{path}:{verb}", json_format.MessageToJson(body).encode(), timeout)
        return json_format.Parse(data, reply, ignore_unknown_fields=True)

    def Classify(self, request, timeout: float):
        return self._infer("classify", request, pb.ClassifyResponse(), timeout)

    def Tag(self, request, timeout: float):
        return self._infer("tag", request, pb.TagResponse(), timeout)

    def ListModels(self, request, timeout: float):
        return json_format.Parse(self._request("GET", "/v1/models", None, timeout), pb.ListModelsResponse(),
                                 ignore_unknown_fields=True)

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()


def _read(data: Union[bytes, str, None]) -> Optional[bytes]:
    """PEM given as bytes, or as the path of a file."""
    if data is None or isinstance(data, bytes):
        return data
    with open(data, "rb") as f:
        return f.read()


_PRIORITIES = {"": 0, "high": 1, "normal": 2, "low": 3}


def _priority(name: str) -> int:
    if name not in _PRIORITIES:
        raise ValueError(f"priority: {name!r}; want 'high', 'normal', 'low' or '' (the API key's default)")
    return _PRIORITIES[name]


class Client:
    """A connection to qvi-server. `target` is host:port. tls=True speaks TLS (root_certificates: the
    server's CA, PEM bytes or a path; None = the system's roots); certificate_chain and private_key
    add a client certificate (mutual TLS). protocol="http" calls the server's HTTP/JSON port (plain
    HTTP only) instead of gRPC, with the same methods, answers and errors. api_key: the key of a server
    with --api-keys, sent as `authorization: Bearer KEY` (default: the environment's QVI_API_KEY, if set)."""

    def __init__(self, target: str, *, protocol: str = "grpc", tls: bool = False, root_certificates: Union[bytes, str, None] = None,
                 certificate_chain: Union[bytes, str, None] = None, private_key: Union[bytes, str, None] = None,
                 timeout: float = 10.0, retries: int = 3, backoff: float = 0.1, max_backoff: float = 2.0,
                 options: Sequence[Tuple[str, object]] = (), sleep: Callable[[float], None] = time.sleep,
                 api_key: Optional[str] = None):
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if retries < 0:
            raise ValueError("retries must not be negative")
        if protocol not in ("grpc", "http"):
            raise ValueError(f"protocol: {protocol!r}; want 'grpc' or 'http'")
        self._channel = None
        api_key = api_key if api_key is not None else os.environ.get("QVI_API_KEY") or None
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else None
        if protocol == "http":
            if tls or root_certificates or certificate_chain or private_key or options:
                raise ValueError("protocol='http' takes no TLS or channel options: the HTTP port speaks plain HTTP")
            self._stub = _HttpStub(target, api_key)
        elif tls:
            creds = grpc.ssl_channel_credentials(_read(root_certificates), _read(private_key),
                                                 _read(certificate_chain))
            self._channel = grpc.secure_channel(target, creds, options=list(options))
        else:
            if root_certificates or certificate_chain or private_key:
                raise ValueError("certificates given without tls=True")
            self._channel = grpc.insecure_channel(target, options=list(options))
        if self._channel is not None:
            self._stub = pb_grpc.InferenceStub(self._channel)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._sleep = sleep

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        else:
            self._stub.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def classify(self, model: str, texts: Union[str, Sequence[str]], *, version: int = 0, top_k: int = 0,
                 attention: bool = False, gates: bool = False, tokens: bool = False, truncation: str = "truncate",
                 layers: Optional[dict] = None, request_id: str = "", timeout: Optional[float] = None,
                 priority: str = "", subwords: bool = False) -> Answer:
        """Labels (best first; top_k > 0 for the k best) for each text, and α / β per token when asked.
        subwords: a sub-word model (`qvi import`) answers per sub-word, special tokens included, not per word.
        layers: per-layer outputs of Transformer models, e.g. {"gates": True, "attention_maps": True,
        "layers": [0], "heads": [0, 1], "reduction": "mean_heads"}. priority: "high", "normal" or "low"
        (default: the API key's, else normal), the request's place in a busy model's queue."""
        request = pb.ClassifyRequest(model=pb.ModelSpec(name=model, version=version), texts=_texts(texts),
                                     options=_options(top_k, attention, gates, tokens, truncation, layers, subwords),
                                     request_id=request_id, priority=_priority(priority))
        reply = self._call(self._stub.Classify, request, timeout)
        return Answer(reply.model.name, reply.model.version, reply.request_id,
                      [Classification([LabelScore(l.label, l.score) for l in r.labels], [_token(t) for t in r.tokens],
                                      r.truncated, r.num_tokens, _layers(r.layers)) for r in reply.results])

    def tag(self, model: str, texts: Union[str, Sequence[str]], *, version: int = 0, attention: bool = False,
            gates: bool = False, truncation: str = "truncate", layers: Optional[dict] = None, request_id: str = "",
            timeout: Optional[float] = None, priority: str = "", subwords: bool = False) -> Answer:
        """Entity spans and every token with its tag for each text; α / β per token when asked.
        priority, subwords: as classify's."""
        request = pb.TagRequest(model=pb.ModelSpec(name=model, version=version), texts=_texts(texts),
                                options=_options(0, attention, gates, False, truncation, layers, subwords),
                                request_id=request_id, priority=_priority(priority))
        reply = self._call(self._stub.Tag, request, timeout)
        return Answer(reply.model.name, reply.model.version, reply.request_id,
                      [Tagging([Span(s.label, s.start, s.end, s.text, s.score, s.byte_start, s.byte_end, s.token_start,
                                     s.token_end) for s in r.spans],
                               [_token(t) for t in r.tokens], r.truncated, r.num_tokens, _layers(r.layers))
                       for r in reply.results])

    def list_models(self, timeout: Optional[float] = None) -> List[ModelState]:
        """Every model in the store with the state of each of its versions, newest first."""
        reply = self._call(self._stub.ListModels, pb.ListModelsRequest(), timeout)
        return [ModelState(m.name, [VersionState(v.version, pb.ModelState.Name(v.state).replace("MODEL_STATE_", ""),
                                                 v.reason) for v in m.versions]) for m in reply.models]

    def _stream(self, method: str, requests: Iterator):
        """`method` ("ClassifyStream", "TagStream") over `requests`: the answers as they come, without a
        deadline (a stream lasts as long as its input; qvi_client.batch uses it)."""
        if self._channel is None:
            raise ValueError("streams need gRPC: protocol='http' has none")
        call = getattr(self._stub, method)
        return call(requests, metadata=self._metadata) if self._metadata else call(requests)

    def _call(self, method, request, timeout: Optional[float]):
        """One call with retries of UNAVAILABLE, all within one deadline."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        delay = self.backoff
        attempt = 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise QviError(grpc.StatusCode.DEADLINE_EXCEEDED, "the deadline passed between retries", attempt - 1)
            try:
                if self._channel is not None and self._metadata:
                    return method(request, timeout=left, metadata=self._metadata)
                return method(request, timeout=left)
            except grpc.RpcError as e:
                code = e.code()
                if code != grpc.StatusCode.UNAVAILABLE or attempt > self.retries:
                    raise QviError(code, e.details() or "", attempt) from None
                # Full jitter: clients that failed together do not come back together.
                pause = min(random.uniform(0, delay), max(0.0, deadline - time.monotonic()))
                log.info("UNAVAILABLE (%s); attempt %d of %d again in %.3f s", e.details(), attempt + 1,
                         self.retries + 1, pause)
                self._sleep(pause)
                delay = min(delay * 2, self.max_backoff)


def _texts(texts: Union[str, Sequence[str]]) -> List[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def _options(top_k, attention, gates, tokens, truncation, layers, subwords=False) -> "pb.OutputOptions":
    if truncation not in _TRUNCATION:
        raise ValueError(f"truncation: {truncation!r}; want 'truncate' or 'error'")
    options = pb.OutputOptions(top_k=top_k, attention=attention, gates=gates, tokens=tokens,
                               truncation=_TRUNCATION[truncation], subwords=subwords)
    if layers:
        unknown = set(layers) - {"gates", "attention_maps", "layers", "heads", "reduction"}
        if unknown:
            raise ValueError(f"layers: unknown keys {sorted(unknown)}")
        reduction = layers.get("reduction", "none")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"layers.reduction: {reduction!r}; want one of {sorted(_REDUCTIONS)}")
        options.layers.CopyFrom(pb.LayerOptions(gates=layers.get("gates", False),
                                                attention_maps=layers.get("attention_maps", False),
                                                layers=layers.get("layers", []), heads=layers.get("heads", []),
                                                reduction=_REDUCTIONS[reduction]))
    return options
