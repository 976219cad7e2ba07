"""The response cache (--response-cache-bytes; docs/serving.md "Response cache"), end to end: a text
asked again with the same options is answered from the cache, whichever protocol asks; a request with
some texts known sends only the others to the model; a new version never answers from the old one's
entries."""
import os
import shutil


from conftest import oip_calls
from qvi_testing import STORE, ServerProcess, wait_until


def explained(pb, texts):
    return pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=texts,
                              options=pb.OutputOptions(attention=True, gates=True))


def answers(result):
    """What must agree to the bit between a cached and a computed answer: labels, tokens, α and β."""
    return [([(l.label, l.score) for l in r.labels], [(t.text, t.attention, t.gate) for t in r.tokens])
            for r in result.results]


def test_known_texts_are_answered_from_the_cache_and_a_new_version_starts_afresh(api, tmp_path, interop_python):
    store = tmp_path / "store"
    shutil.copytree(os.path.join(STORE, "sentiment", "1"), store / "sentiment" / "1")
    proc = ServerProcess(str(store), str(tmp_path), "--response-cache-bytes", str(64 << 20),
                         "--poll-store-seconds", "0.1")
    try:
        pb, pb_grpc = api
        stub = pb_grpc.InferenceStub(proc.channel)

        def counted(name):
            return proc.metrics().get(f'qvi_response_cache_{name}_total{{model="sentiment"}}', 0)

        first = stub.Classify(explained(pb, ["A moving, funny film.", "Dull and far too long."]), timeout=30)
        assert (counted("hits"), counted("misses")) == (0, 2)
        second = stub.Classify(explained(pb, ["Dull and far too long.", "Something new.", "A moving, funny film."]),
                               timeout=30)
        assert (counted("hits"), counted("misses")) == (2, 3)
        assert answers(second)[0] == answers(first)[1] and answers(second)[2] == answers(first)[0]
        assert proc.metrics()["qvi_response_cache_bytes"] > 0

        # OIP's ModelInfer goes through the same cache (its own options: other entries, then hits).
        calls = [{"client": "triton", "rpc": "infer", "model": "sentiment", "texts": ["A moving, funny film."]}] * 2
        for result in oip_calls(interop_python, proc.address, calls):
            assert result["ok"], result
        assert (counted("hits"), counted("misses")) == (3, 4)

        # Version 2 arrives: its answers are computed, never taken from version 1's entries.
        staging = store / "sentiment" / ".2.tmp"
        shutil.copytree(os.path.join(STORE, "sentiment", "1"), staging)
        os.rename(staging, store / "sentiment" / "2")
        wait_until(lambda: stub.Classify(explained(pb, ["probe"]), timeout=30).model.version == 2,
                   "version 2 serving", seconds=60)
        misses = counted("misses")
        again = stub.Classify(explained(pb, ["A moving, funny film."]), timeout=30)
        assert again.model.version == 2
        assert counted("misses") == misses + 1, "version 2 had no entry for the text"
        # Computed again (alone, not in a batch of two): the same weights answer the same, to float rounding.
        again_labels, again_tokens = answers(again)[0]
        first_labels, first_tokens = answers(first)[0]
        assert [l for l, _ in again_labels] == [l for l, _ in first_labels]
        assert all(abs(a[1] - b[1]) < 1e-5 and abs(a[2] - b[2]) < 1e-5 for a, b in zip(again_tokens, first_tokens))
    finally:
        proc.stop()
