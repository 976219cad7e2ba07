from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TruncationPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRUNCATION_POLICY_TRUNCATE: _ClassVar[TruncationPolicy]
    TRUNCATION_POLICY_ERROR: _ClassVar[TruncationPolicy]

class LayerReduction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYER_REDUCTION_NONE: _ClassVar[LayerReduction]
    LAYER_REDUCTION_MEAN_HEADS: _ClassVar[LayerReduction]
    LAYER_REDUCTION_MEAN_ALL: _ClassVar[LayerReduction]

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_READY: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
    MODEL_STATE_UNLOADING: _ClassVar[ModelState]
TRUNCATION_POLICY_TRUNCATE: TruncationPolicy
TRUNCATION_POLICY_ERROR: TruncationPolicy
LAYER_REDUCTION_NONE: LayerReduction
LAYER_REDUCTION_MEAN_HEADS: LayerReduction
LAYER_REDUCTION_MEAN_ALL: LayerReduction
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_READY: ModelState
MODEL_STATE_FAILED: ModelState
MODEL_STATE_UNLOADING: ModelState

class ModelSpec(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class LayerOptions(_message.Message):
    __slots__ = ("gates", "attention_maps", "layers", "heads", "reduction")
    GATES_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_MAPS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    REDUCTION_FIELD_NUMBER: _ClassVar[int]
    gates: bool
    attention_maps: bool
    layers: _containers.RepeatedScalarFieldContainer[int]
    heads: _containers.RepeatedScalarFieldContainer[int]
    reduction: LayerReduction
    def __init__(self, gates: _Optional[bool] = ..., attention_maps: _Optional[bool] = ..., layers: _Optional[_Iterable[int]] = ..., heads: _Optional[_Iterable[int]] = ..., reduction: _Optional[_Union[LayerReduction, str]] = ...) -> None: ...

class OutputOptions(_message.Message):
    __slots__ = ("top_k", "attention", "gates", "tokens", "truncation", "layers")
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    top_k: int
    attention: bool
    gates: bool
    tokens: bool
    truncation: TruncationPolicy
    layers: LayerOptions
    def __init__(self, top_k: _Optional[int] = ..., attention: _Optional[bool] = ..., gates: _Optional[bool] = ..., tokens: _Optional[bool] = ..., truncation: _Optional[_Union[TruncationPolicy, str]] = ..., layers: _Optional[_Union[LayerOptions, _Mapping]] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("model", "texts", "options", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    texts: _containers.RepeatedScalarFieldContainer[str]
    options: OutputOptions
    request_id: str
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ..., texts: _Optional[_Iterable[str]] = ..., options: _Optional[_Union[OutputOptions, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("model", "results", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    results: _containers.RepeatedCompositeFieldContainer[Classification]
    request_id: str
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ..., results: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class TagRequest(_message.Message):
    __slots__ = ("model", "texts", "options", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    texts: _containers.RepeatedScalarFieldContainer[str]
    options: OutputOptions
    request_id: str
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ..., texts: _Optional[_Iterable[str]] = ..., options: _Optional[_Union[OutputOptions, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class TagResponse(_message.Message):
    __slots__ = ("model", "results", "request_id")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    results: _containers.RepeatedCompositeFieldContainer[Tagging]
    request_id: str
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ..., results: _Optional[_Iterable[_Union[Tagging, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("labels", "tokens", "truncated", "num_tokens", "layers")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[LabelScore]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    truncated: bool
    num_tokens: int
    layers: _containers.RepeatedCompositeFieldContainer[LayerMap]
    def __init__(self, labels: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ..., tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ..., truncated: _Optional[bool] = ..., num_tokens: _Optional[int] = ..., layers: _Optional[_Iterable[_Union[LayerMap, _Mapping]]] = ...) -> None: ...

class Tagging(_message.Message):
    __slots__ = ("spans", "tokens", "truncated", "num_tokens", "layers")
    SPANS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    spans: _containers.RepeatedCompositeFieldContainer[Span]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    truncated: bool
    num_tokens: int
    layers: _containers.RepeatedCompositeFieldContainer[LayerMap]
    def __init__(self, spans: _Optional[_Iterable[_Union[Span, _Mapping]]] = ..., tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ..., truncated: _Optional[bool] = ..., num_tokens: _Optional[int] = ..., layers: _Optional[_Iterable[_Union[LayerMap, _Mapping]]] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("text", "start", "end", "byte_start", "byte_end", "normalized", "id", "attention", "gate", "tag", "sentence_attention", "sentence_gate", "lambda_q", "lambda_k")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BYTE_START_FIELD_NUMBER: _ClassVar[int]
    BYTE_END_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    GATE_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    SENTENCE_ATTENTION_FIELD_NUMBER: _ClassVar[int]
    SENTENCE_GATE_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_Q_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_K_FIELD_NUMBER: _ClassVar[int]
    text: str
    start: int
    end: int
    byte_start: int
    byte_end: int
    normalized: str
    id: int
    attention: float
    gate: float
    tag: str
    sentence_attention: float
    sentence_gate: float
    lambda_q: float
    lambda_k: float
    def __init__(self, text: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., byte_start: _Optional[int] = ..., byte_end: _Optional[int] = ..., normalized: _Optional[str] = ..., id: _Optional[int] = ..., attention: _Optional[float] = ..., gate: _Optional[float] = ..., tag: _Optional[str] = ..., sentence_attention: _Optional[float] = ..., sentence_gate: _Optional[float] = ..., lambda_q: _Optional[float] = ..., lambda_k: _Optional[float] = ...) -> None: ...

class Span(_message.Message):
    __slots__ = ("label", "start", "end", "text", "score", "byte_start", "byte_end", "token_start", "token_end")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    BYTE_START_FIELD_NUMBER: _ClassVar[int]
    BYTE_END_FIELD_NUMBER: _ClassVar[int]
    TOKEN_START_FIELD_NUMBER: _ClassVar[int]
    TOKEN_END_FIELD_NUMBER: _ClassVar[int]
    label: str
    start: int
    end: int
    text: str
    score: float
    byte_start: int
    byte_end: int
    token_start: int
    token_end: int
    def __init__(self, label: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., byte_start: _Optional[int] = ..., byte_end: _Optional[int] = ..., token_start: _Optional[int] = ..., token_end: _Optional[int] = ...) -> None: ...

class LayerMap(_message.Message):
    __slots__ = ("layer", "head", "gates", "lambda_q", "lambda_k", "attention")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    GATES_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_Q_FIELD_NUMBER: _ClassVar[int]
    LAMBDA_K_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_FIELD_NUMBER: _ClassVar[int]
    layer: int
    head: int
    gates: _containers.RepeatedScalarFieldContainer[float]
    lambda_q: _containers.RepeatedScalarFieldContainer[float]
    lambda_k: _containers.RepeatedScalarFieldContainer[float]
    attention: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, layer: _Optional[int] = ..., head: _Optional[int] = ..., gates: _Optional[_Iterable[float]] = ..., lambda_q: _Optional[_Iterable[float]] = ..., lambda_k: _Optional[_Iterable[float]] = ..., attention: _Optional[_Iterable[float]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ...) -> None: ...

class GetModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelInfo
    def __init__(self, model: _Optional[_Union[ModelInfo, _Mapping]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "versions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    versions: _containers.RepeatedCompositeFieldContainer[ModelVersion]
    def __init__(self, name: _Optional[str] = ..., versions: _Optional[_Iterable[_Union[ModelVersion, _Mapping]]] = ...) -> None: ...

class ModelVersion(_message.Message):
    __slots__ = ("version", "state", "reason", "metadata")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    version: int
    state: ModelState
    reason: str
    metadata: ModelMetadata
    def __init__(self, version: _Optional[int] = ..., state: _Optional[_Union[ModelState, str]] = ..., reason: _Optional[str] = ..., metadata: _Optional[_Union[ModelMetadata, _Mapping]] = ...) -> None: ...

class ModelMetadata(_message.Message):
    __slots__ = ("task", "architecture", "display_name", "interaction", "description", "labels", "tags", "tag_scheme", "entity_types", "tokenizer", "outputs", "layers", "heads", "device", "batching", "model_card_json", "format", "format_note")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    INTERACTION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TAG_SCHEME_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPES_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    MODEL_CARD_JSON_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_NOTE_FIELD_NUMBER: _ClassVar[int]
    task: str
    architecture: str
    display_name: str
    interaction: str
    description: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.RepeatedScalarFieldContainer[str]
    tag_scheme: str
    entity_types: _containers.RepeatedScalarFieldContainer[str]
    tokenizer: TokenizerInfo
    outputs: _containers.RepeatedCompositeFieldContainer[OutputInfo]
    layers: int
    heads: int
    device: str
    batching: BatchingInfo
    model_card_json: str
    format: str
    format_note: str
    def __init__(self, task: _Optional[str] = ..., architecture: _Optional[str] = ..., display_name: _Optional[str] = ..., interaction: _Optional[str] = ..., description: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., tags: _Optional[_Iterable[str]] = ..., tag_scheme: _Optional[str] = ..., entity_types: _Optional[_Iterable[str]] = ..., tokenizer: _Optional[_Union[TokenizerInfo, _Mapping]] = ..., outputs: _Optional[_Iterable[_Union[OutputInfo, _Mapping]]] = ..., layers: _Optional[int] = ..., heads: _Optional[int] = ..., device: _Optional[str] = ..., batching: _Optional[_Union[BatchingInfo, _Mapping]] = ..., model_card_json: _Optional[str] = ..., format: _Optional[str] = ..., format_note: _Optional[str] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("level", "lowercase", "max_tokens", "vocab_size")
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    LOWERCASE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    level: str
    lowercase: bool
    max_tokens: int
    vocab_size: int
    def __init__(self, level: _Optional[str] = ..., lowercase: _Optional[bool] = ..., max_tokens: _Optional[int] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class OutputInfo(_message.Message):
    __slots__ = ("name", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchingInfo(_message.Message):
    __slots__ = ("max_batch_size", "max_batch_tokens", "max_queue_delay_ms", "instances", "batch_when_idle")
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    BATCH_WHEN_IDLE_FIELD_NUMBER: _ClassVar[int]
    max_batch_size: int
    max_batch_tokens: int
    max_queue_delay_ms: float
    instances: int
    batch_when_idle: bool
    def __init__(self, max_batch_size: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., max_queue_delay_ms: _Optional[float] = ..., instances: _Optional[int] = ..., batch_when_idle: _Optional[bool] = ...) -> None: ...
