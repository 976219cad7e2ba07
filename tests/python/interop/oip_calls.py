"""Calls qvi-server through the Open Inference Protocol with real clients: tritonclient's gRPC
client, KServe's InferenceGRPCClient, and on the HTTP port (target host:port of that port) KServe's
InferenceRESTClient (client "kserve_rest") and tritonclient's HTTP client (client "triton_http", with the
binary-data extension as it sends by default, or with "binary": false JSON only). Runs in the interop virtual environment (see
requirements.txt beside it; tests/python/conftest.py makes it), not in the project's .venv: both
clients pin protobuf and grpcio-tools versions of their own.

    python oip_calls.py CALLS.json   ->   one JSON result per call on stdout (a list)

CALLS.json: {"target": "host:port", "calls": [...]}, every call made with the same client.

A call: {"client": "triton" | "triton_http" | "kserve" | "kserve_rest", "rpc": "live" | "ready" | "model_ready" | "server_metadata" |
"model_metadata" | "infer" | "repository_index" | "load_model" | "unload_model" (tritonclient, and KServe's gRPC stub; "config" for a tritonclient load), "model", "version", "texts", "outputs": [{"name", "class_count"}],
"parameters", "priority" (tritonclient only: its infer(priority=N)), "headers" (tritonclient only: gRPC metadata or HTTP headers), "timeout" (the client's deadline, s), "server_timeout" (the "timeout"
parameter, µs), "id", "input": {"name", "datatype", "shape"}, "as_list": bool, "binary": bool}.
A result: {"ok": true, "value": ...} or {"ok": false, "code": "INVALID_ARGUMENT", "message": ...}.
"""
import asyncio
import json
import sys

import grpc
import numpy as np


def plain(array):
    """A numpy output as JSON: BYTES elements decoded as UTF-8."""
    if array.dtype == object:
        return np.vectorize(lambda b: b.decode("utf-8") if isinstance(b, bytes) else b, otypes=[object])(array).tolist()
    return array.tolist()


def triton_call(client, call, tg=None):
    """tritonclient's gRPC client, or with tg=tritonclient.http its HTTP client (the same calls)."""
    if tg is None:
        import tritonclient.grpc as tg
    http = tg.__name__ == "tritonclient.http"
    binary = call.get("binary", True)  # the HTTP client's defaults: inputs and outputs in binary

    headers = call.get("headers")  # {"authorization": "Bearer KEY"}, say
    rpc = call["rpc"]
    if rpc == "live":
        return client.is_server_live(headers=headers)
    if rpc == "ready":
        return client.is_server_ready(headers=headers)
    if rpc == "model_ready":
        return client.is_model_ready(call["model"], call.get("version", ""), headers=headers)
    if rpc == "server_metadata":
        return client.get_server_metadata(headers=headers) if http else client.get_server_metadata(headers=headers, as_json=True)
    if rpc == "model_metadata":
        if http:
            return client.get_model_metadata(call["model"], call.get("version", ""), headers=headers)
        return client.get_model_metadata(call["model"], call.get("version", ""), headers=headers, as_json=True)
    if rpc == "repository_index":  # the HTTP client answers a list, the gRPC one {"models": [...]}
        if http:
            return client.get_model_repository_index(headers=headers)
        return client.get_model_repository_index(headers=headers, as_json=True).get("models", [])
    if rpc == "load_model":
        return client.load_model(call["model"], headers=headers, config=call.get("config"))
    if rpc == "unload_model":
        return client.unload_model(call["model"], headers=headers,
                                   unload_dependents=call.get("unload_dependents", False))
    spec = call.get("input", {})
    texts = np.array([t.encode("utf-8") for t in call["texts"]], dtype=object)
    shape = spec.get("shape", [len(texts)])
    inp = tg.InferInput(spec.get("name", "text"), shape, spec.get("datatype", "BYTES"))
    if http:
        inp.set_data_from_numpy(texts.reshape(shape), binary_data=binary)
        outputs = [tg.InferRequestedOutput(o["name"], binary_data=binary, class_count=o.get("class_count", 0))
                   for o in call.get("outputs", [])]
        result = client.infer(call["model"], [inp], model_version=call.get("version", ""), outputs=outputs or None,
                              request_id=call.get("id", ""), parameters=call.get("parameters"),
                              priority=call.get("priority", 0), timeout=call.get("server_timeout"), headers=headers)
        response = result.get_response()  # a dict: the JSON header
        tensors = [(o["name"], o["datatype"], o["shape"]) for o in response["outputs"]]
        ids = (response["model_name"], response["model_version"], response.get("id", ""))
    else:
        inp.set_data_from_numpy(texts.reshape(shape))
        outputs = [tg.InferRequestedOutput(o["name"], class_count=o.get("class_count", 0))
                   for o in call.get("outputs", [])]
        result = client.infer(call["model"], [inp], model_version=call.get("version", ""), outputs=outputs or None,
                              request_id=call.get("id", ""), parameters=call.get("parameters"),
                              priority=call.get("priority", 0), client_timeout=call.get("timeout"), timeout=call.get("server_timeout"), headers=headers)
        response = result.get_response()
        tensors = [(o.name, o.datatype, o.shape) for o in response.outputs]
        ids = (response.model_name, response.model_version, response.id)
    return {
        "model_name": ids[0],
        "model_version": ids[1],
        "id": ids[2],
        "outputs": {name: {"datatype": datatype, "shape": list(shape), "data": plain(result.as_numpy(name))}
                    for name, datatype, shape in tensors},
    }


async def kserve_call(client, call, base_url=None):
    """KServe's gRPC client, or with base_url its REST client (whose calls take the URL first)."""
    from kserve import InferInput, InferRequest
    from kserve.protocol.infer_type import RequestedOutput
    if call["rpc"] in ("load_model", "unload_model"):
        # KServe's clients have no repository calls; its generated stub (its own messages, the model's
        # name in field 1) has them, on the client's channel.
        from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
        metadata = tuple(call.get("headers", {}).items()) or None
        if call["rpc"] == "load_model":
            r = await client._client_stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=call["model"]),
                                                              metadata=metadata)
            return {"model_name": r.model_name, "loaded": r.isLoaded}
        r = await client._client_stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=call["model"]),
                                                            metadata=metadata)
        return {"model_name": r.model_name, "unloaded": r.isUnloaded}

    at = (base_url,) if base_url else ()
    rpc = call["rpc"]
    if rpc == "live":
        return await client.is_server_live(*at)
    if rpc == "ready":
        return await client.is_server_ready(*at)
    if rpc == "model_ready":
        return await client.is_model_ready(*at, call["model"])
    assert rpc == "infer", rpc
    texts = call["texts"]
    inp = InferInput(name="text", shape=[len(texts)], datatype="BYTES")
    if base_url:  # REST: the texts as JSON strings
        inp.set_data_from_numpy(np.array(list(texts), dtype=object), binary_data=False)
    elif call.get("as_list"):
        inp.set_data_from_numpy  # the list path: contents.bytes_contents
        inp._data = list(texts)
    else:  # the numpy path: raw_input_contents
        inp.set_data_from_numpy(np.array([t.encode("utf-8") for t in texts], dtype=object), binary_data=True)
    outputs = [RequestedOutput(name=o["name"], parameters=o.get("parameters")) for o in call.get("outputs", [])]
    request = InferRequest(model_name=call["model"], infer_inputs=[inp], request_id=call.get("id"),
                           parameters=call.get("parameters"), request_outputs=outputs or None,
                           model_version=call.get("version"))
    if base_url:
        response = await client.infer(base_url, request, model_name=call["model"])
    else:
        response = await client.infer(request)
    return {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "id": response.id,
        "outputs": {o.name: {"datatype": o.datatype, "shape": list(o.shape), "data": plain(o.as_numpy())}
                    for o in response.outputs},
    }


def error_of(exc):
    if isinstance(exc, grpc.RpcError):
        return {"ok": False, "code": exc.code().name, "message": exc.details()}
    response = getattr(exc, "response", None)
    if response is not None and hasattr(response, "status_code"):  # httpx.HTTPStatusError: the HTTP status
        return {"ok": False, "code": response.status_code, "message": response.json().get("error", "")}
    status = getattr(exc, "status", None)
    if callable(status):  # tritonclient's InferenceServerException: "StatusCode.INVALID_ARGUMENT"
        return {"ok": False, "code": str(status()).replace("StatusCode.", ""), "message": exc.message()}
    raise exc


async def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    target = spec["target"]
    results = []
    # One client per process: both register the same proto package (inference) in protobuf's
    # default pool, and a process that imports both fails with "duplicate symbol".
    clients = {call["client"] for call in spec["calls"]}
    assert len(clients) == 1, clients
    if clients == {"triton"}:
        import tritonclient.grpc as tg
        triton = tg.InferenceServerClient(target)
        for call in spec["calls"]:
            try:
                results.append({"ok": True, "value": triton_call(triton, call)})
            except Exception as exc:  # noqa: BLE001 - every failure is reported, or re-raised in error_of
                results.append(error_of(exc))
        triton.close()
    elif clients == {"triton_http"}:
        import tritonclient.http as th
        triton = th.InferenceServerClient(target)
        for call in spec["calls"]:
            try:
                results.append({"ok": True, "value": triton_call(triton, call, th)})
            except Exception as exc:  # noqa: BLE001 - every failure is reported, or re-raised in error_of
                results.append(error_of(exc))
        triton.close()
    elif clients == {"kserve_rest"}:
        from kserve import InferenceRESTClient, RESTConfig
        rest = InferenceRESTClient(RESTConfig(protocol="v2", retries=0))
        for call in spec["calls"]:
            try:
                results.append({"ok": True, "value": await kserve_call(rest, call, f"http://{target}")})
            except Exception as exc:  # noqa: BLE001
                results.append(error_of(exc))
        await rest.close()
    else:
        from kserve import InferenceGRPCClient
        async with InferenceGRPCClient(target, retries=0) as kserve:
            for call in spec["calls"]:
                try:
                    results.append({"ok": True, "value": await kserve_call(kserve, call)})
                except Exception as exc:  # noqa: BLE001
                    results.append(error_of(exc))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
