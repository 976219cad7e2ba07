// The null backend: a model that does no math, for measuring the serving path alone (bench/run.py
// --null; docs/performance.md, "The cost of serving itself"). A version folder holding model.null
// -- a JSON object {"manifest": {...}, "vocab": ["[PAD]", "[UNK]", ...]}, the manifest and vocabulary
// a real artifact carries (`python -m qvi null` writes one from an exported model) -- is served by it
// whatever else the folder holds, with format "null" in GetModel and the log. Its outputs have the
// manifest's shapes and plausible values: zero scores (every label or tag equally likely, the first
// one chosen), α uniform over a text's tokens, every gate 0.5. The demo store never holds one.
//
// An emulated accelerator: with "device_us": {"per_batch": 300, "per_text": 3} in model.null, every
// batch also holds a device -- one in-order queue per version, as a GPU stream -- for per_batch +
// per_text x its texts microseconds, whoever collects it asleep meanwhile (no CPU used), and reports
// that time (qvi_device_busy_seconds_total). Its Launch returns at once, as a GPU's does, so that the
// runner's pipeline (model_runner.h) works on it as on a GPU; with "asynchronous": false in
// device_us the runner collects each batch before launching the next (the engine without its
// pipeline, for comparison). A 2-core machine then measures how well the engine keeps
// a device busy with its own CPU work around the batches (bench/run.py --emulated-device).
// "hold_while_file": PATH in device_us keeps each batch on the device, after its time, while PATH exists
// (at most 120 s): a test decides when a batch ends, with no race against a clock.
#ifndef QVI_SERVER_CORE_MODEL_NULL_MODEL_H_
#define QVI_SERVER_CORE_MODEL_NULL_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/model/model.h"

namespace qvi {

inline constexpr char kNullModelFile[] = "model.null";

// Reads `path` (model.null), checks its manifest and vocabulary and warms it up like any model.
absl::StatusOr<std::unique_ptr<Model>> LoadNullModel(const std::string& path, const c10::Device& device);

}  // namespace qvi

#endif  // QVI_SERVER_CORE_MODEL_NULL_MODEL_H_
