// The walk of a request's wire bytes before it is parsed (server/grpc/wire/wire_scan.h): floods of empty
// elements, unknown fields and groups are refused naming the field and the cap, allocating nothing per
// element; what passes is parsed exactly as protobuf would, and holds at most a few times its wire
// size; strings that are not UTF-8 and truncated messages are named. The same floods against the
// running server are in tests/python/test_abuse_limits.py.
#include "server/grpc/wire/wire_scan.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/message_differencer.h>
#include <google/protobuf/wire_format_lite.h>
#include <gtest/gtest.h>

#include <string>

#include "inference/open_inference_grpc.pb.h"
#include "qvi/serving/v1/inference.pb.h"
#include "tests/cpp/test_util/count_allocations.h"

namespace qvi {
namespace {

using google::protobuf::internal::WireFormatLite;
using inference::ModelInferRequest;
using serving::v1::ClassifyRequest;

constexpr size_t kFloodBytes = 16 << 20;  // the server's default message limit
// What a request within the caps may hold beyond 4 times its wire size: the caps' elements.
constexpr int64_t kConstantBytes = 512 << 10;

// `field` as an empty length-delimited element, repeated until `bytes` are written.
std::string Flood(int field, size_t bytes) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  {
    google::protobuf::io::CodedOutputStream coded(&stream);
    const uint32_t tag = WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
    while (static_cast<size_t>(coded.ByteCount()) + 8 < bytes) {
      coded.WriteTag(tag);
      coded.WriteVarint32(0);
    }
  }
  return out;
}

// `inner` as the value of the message field `field`.
std::string Wrap(int field, const std::string& inner) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  {
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint32(static_cast<uint32_t>(inner.size()));
    coded.WriteString(inner);
  }
  return out;
}

struct Outcome {
  absl::Status status;
  int64_t allocations = 0;
};

Outcome Decode(const std::string& wire, google::protobuf::Message* out) {
  static const WireCaps caps = DefaultWireCaps(RequestLimits{});
  (void)out->GetDescriptor();  // protobuf builds each file's descriptors on their first use
  const int64_t before = testing::Allocations();
  Outcome o;
  o.status = DecodeRequest(wire.data(), wire.size(), caps, out);
  o.allocations = testing::Allocations() - before;
  return o;
}

void ExpectRefused(const std::string& wire, google::protobuf::Message* out, const std::string& part) {
  const Outcome o = Decode(wire, out);
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument) << o.status;
  EXPECT_NE(o.status.message().find(part), std::string::npos) << o.status.message();
  EXPECT_LT(o.status.message().size(), 400u);
  // A few for the walk's own bookkeeping and the message; none per element (millions were sent).
  EXPECT_LT(o.allocations, 300) << part;
  EXPECT_LT(out->SpaceUsedLong(), 4096) << "the flood was parsed";
}

TEST(WireScanTest, FloodsOfEmptyElementsAreRefusedBeforeParsing) {
  ClassifyRequest classify;
  ExpectRefused(Flood(ClassifyRequest::kTextsFieldNumber, kFloodBytes), &classify,
                "texts: 8388604 texts exceed the limit of 256 per request");
  ModelInferRequest infer;
  ExpectRefused(Flood(ModelInferRequest::kInputsFieldNumber, kFloodBytes), &infer,
                "inputs exceed the limit of 16 per request");
  ExpectRefused(Flood(ModelInferRequest::kOutputsFieldNumber, kFloodBytes), &infer,
                "outputs exceed the limit of 64 per request");
  ExpectRefused(Flood(ModelInferRequest::kRawInputContentsFieldNumber, kFloodBytes), &infer,
                "raw_input_contents: 8388604 raw input buffers exceed the limit of 16 per request");
  ExpectRefused(Flood(ModelInferRequest::kParametersFieldNumber, kFloodBytes), &infer,
                "parameters exceed the limit of 64 per request");
  // Deep inside: inputs[0].contents.bytes_contents.
  const std::string contents = Wrap(ModelInferRequest::InferInputTensor::kContentsFieldNumber,
                                    Flood(inference::InferTensorContents::kBytesContentsFieldNumber, kFloodBytes - 64));
  ExpectRefused(Wrap(ModelInferRequest::kInputsFieldNumber, contents), &infer,
                "inputs[0].contents.bytes_contents: 8388572 texts exceed the limit of 256 per request");
}

TEST(WireScanTest, PackedScalarsAreCountedElementByElement) {
  ClassifyRequest request;
  for (int i = 0; i < 2000; ++i) request.mutable_options()->mutable_layers()->add_layers(i % 3);
  ClassifyRequest out;
  ExpectRefused(request.SerializeAsString(), &out,
                "options.layers.layers: 2000 layer indices exceed the limit of 1024 per request");
  ModelInferRequest infer;
  for (int i = 0; i < 100; ++i) infer.add_inputs()->add_shape(1);
  ModelInferRequest infer_out;
  ExpectRefused(infer.SerializeAsString(), &infer_out, "inputs exceed the limit of 16 per request");
  infer_out.Clear();
  // Counted over the whole request: 8 inputs of 3 dimensions are 24 dimensions.
  infer.Clear();
  for (int i = 0; i < 8; ++i) {
    auto* input = infer.add_inputs();
    for (int d = 0; d < 3; ++d) input->add_shape(1);
  }
  ExpectRefused(infer.SerializeAsString(), &infer_out,
                "inputs[5].shape: 18 dimensions exceed the limit of 16 per request");
}

TEST(WireScanTest, UnknownFieldsAndGroupsAreCapped) {
  std::string wire;
  {
    google::protobuf::io::StringOutputStream stream(&wire);
    google::protobuf::io::CodedOutputStream coded(&stream);
    for (int i = 0; i < 1000; ++i) {
      coded.WriteTag(WireFormatLite::MakeTag(1000, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
      coded.WriteVarint32(0);
    }
  }
  ClassifyRequest out;
  ExpectRefused(wire, &out, "more than 64 fields this server does not know");
  // A known number with the wrong wire type is an unknown field to protobuf too.
  std::string mistyped;
  for (int i = 0; i < 100; ++i) mistyped += std::string("\x10\x01", 2);  // texts (2) as a varint
  ExpectRefused(mistyped, &out, "more than 64 fields this server does not know");
  const std::string group = "\x0b\x0c";  // field 1, start group; end group
  ExpectRefused(group, &out, "field 1: groups are not accepted");
}

TEST(WireScanTest, StringsThatAreNotUtf8AreNamed) {
  ClassifyRequest request;
  request.mutable_model()->set_name("sentiment");
  request.add_texts("fine");
  request.add_texts("caf\xc3");  // protobuf's own setters do not check
  ClassifyRequest out;
  ExpectRefused(request.SerializeAsString(), &out, "texts[1]: ");
  request.set_texts(1, "ok");
  request.mutable_model()->set_name("\xff");
  ExpectRefused(request.SerializeAsString(), &out, "model.name: ");
  inference::ModelMetadataRequest metadata;
  metadata.set_name("\xe2\x82");
  inference::ModelMetadataRequest metadata_out;
  ExpectRefused(metadata.SerializeAsString(), &metadata_out, "name: ");
  // bytes fields are not text: raw contents may hold anything.
  ModelInferRequest infer;
  infer.add_raw_input_contents("\xff\xfe");
  ModelInferRequest infer_out;
  EXPECT_TRUE(Decode(infer.SerializeAsString(), &infer_out).status.ok());
}

TEST(WireScanTest, TruncatedMessagesSaySo) {
  ModelInferRequest request;
  request.set_model_name("sentiment");
  auto* input = request.add_inputs();
  input->set_name("text");
  input->set_datatype("BYTES");
  input->add_shape(1);
  input->mutable_contents()->add_bytes_contents("a good film");
  const std::string wire = request.SerializeAsString();
  ModelInferRequest out;
  ExpectRefused(wire.substr(0, wire.size() - 3), &out,
                "the request is not a valid inference.ModelInferRequest: truncated or malformed at byte");
  ExpectRefused(std::string("\x00\x01", 2), &out, "truncated or malformed at byte");
}

TEST(WireScanTest, WhatPassesIsParsedAsProtobufWouldAndHoldsLittleMoreThanItsSize) {
  // The most a request within the caps holds: every capped field at its cap, elements empty.
  ModelInferRequest request;
  request.set_model_name("sentiment");
  request.set_id("r1");
  for (int i = 0; i < 16; ++i) {
    auto* input = request.add_inputs();
    input->set_name("text");
    input->add_shape(1);
    (*input->mutable_parameters())["p"].set_int64_param(i);
  }
  for (int i = 0; i < 256; ++i) request.mutable_inputs(0)->mutable_contents()->add_bytes_contents("");
  for (int i = 0; i < 64; ++i) request.add_outputs()->set_name("label");
  for (int i = 0; i < 64; ++i) (*request.mutable_parameters())[std::to_string(i)].set_bool_param(true);
  for (int i = 0; i < 16; ++i) request.add_raw_input_contents("");
  const std::string wire = request.SerializeAsString();
  ModelInferRequest out;
  const Outcome o = Decode(wire, &out);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(out, request));
  EXPECT_LE(static_cast<int64_t>(out.SpaceUsedLong()), 4 * static_cast<int64_t>(wire.size()) + kConstantBytes);
  // One text filling the message: its bytes, once.
  ClassifyRequest big;
  big.add_texts(std::string(kFloodBytes - 16, 'a'));
  const std::string big_wire = big.SerializeAsString();
  ClassifyRequest big_out;
  ASSERT_TRUE(Decode(big_wire, &big_out).status.ok());
  EXPECT_LE(static_cast<int64_t>(big_out.SpaceUsedLong()), 4 * static_cast<int64_t>(big_wire.size()) + kConstantBytes);
}

}  // namespace
}  // namespace qvi
