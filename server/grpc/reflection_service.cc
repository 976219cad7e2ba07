#include "server/grpc/reflection_service.h"
#include "server/core/base/exception_text.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "server/core/request/request_checks.h"
#include "server/grpc/status.h"

namespace qvi {

namespace {

using google::protobuf::Descriptor;
using google::protobuf::DescriptorPool;
using google::protobuf::FieldDescriptor;
using google::protobuf::FileDescriptor;

// The answers of one stream. Request and Response are either version's messages: the same fields.
template <typename Request, typename Response>
class Answerer {
 public:
  explicit Answerer(const std::vector<std::string>& services) : services_(services) {}

  void Answer(const Request& request, Response* response) {
    const DescriptorPool* pool = DescriptorPool::generated_pool();
    response->set_valid_host(request.host());
    *response->mutable_original_request() = request;
    switch (request.message_request_case()) {
      case Request::kFileByFilename:
        return Files(pool->FindFileByName(request.file_by_filename()), "file", request.file_by_filename(), response);
      case Request::kFileContainingSymbol:
        return Files(pool->FindFileContainingSymbol(request.file_containing_symbol()), "symbol",
                     request.file_containing_symbol(), response);
      case Request::kFileContainingExtension: {
        const auto& ext = request.file_containing_extension();
        const Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
        const FieldDescriptor* field = type ? pool->FindExtensionByNumber(type, ext.extension_number()) : nullptr;
        return Files(field ? field->file() : nullptr, "extension",
                     absl::StrCat(ext.containing_type(), "(", ext.extension_number(), ")"), response);
      }
      case Request::kAllExtensionNumbersOfType: {
        const Descriptor* type = pool->FindMessageTypeByName(request.all_extension_numbers_of_type());
        if (type == nullptr) return NotFound("type", request.all_extension_numbers_of_type(), response);
        std::vector<const FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* numbers = response->mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        for (const FieldDescriptor* e : extensions) numbers->add_extension_number(e->number());
        return;
      }
      case Request::kListServices:
        for (const std::string& name : services_) {
          response->mutable_list_services_response()->add_service()->set_name(name);
        }
        return;
      default:
        response->mutable_error_response()->set_error_code(grpc::StatusCode::INVALID_ARGUMENT);
        response->mutable_error_response()->set_error_message("the request asks for nothing: no message_request set");
    }
  }

 private:
  static void NotFound(const char* what, const std::string& name, Response* response) {
    response->mutable_error_response()->set_error_code(grpc::StatusCode::NOT_FOUND);
    response->mutable_error_response()->set_error_message(absl::StrCat("no ", what, " '", Capped(name), "'"));
  }

  // `file` and, before it, those of its dependencies this stream has not been sent yet.
  void Files(const FileDescriptor* file, const char* what, const std::string& name, Response* response) {
    if (file == nullptr) return NotFound(what, name, response);
    auto* files = response->mutable_file_descriptor_response();
    std::vector<const FileDescriptor*> todo = {file};
    bool first = true;
    while (!todo.empty()) {
      const FileDescriptor* f = todo.back();
      todo.pop_back();
      // The file asked for is always sent, even when it was before; its dependencies once a stream.
      if (!sent_.insert(f->name()).second && !first) continue;
      first = false;
      google::protobuf::FileDescriptorProto proto;
      f->CopyTo(&proto);
      proto.SerializeToString(files->add_file_descriptor_proto());
      for (int i = 0; i < f->dependency_count(); ++i) todo.push_back(f->dependency(i));
    }
  }

  const std::vector<std::string>& services_;
  absl::flat_hash_set<std::string> sent_;
};

// One stream: read a request, answer it, read the next, until the client half-closes.
template <typename Request, typename Response>
class ReflectionReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ReflectionReactor(const std::vector<std::string>& services, const WireCaps& caps) : answers_(services), caps_(caps) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);  // the client is done (or gone)
    grpc::Status status;
    try {
      status = AnswerOne();
    } catch (...) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("answering failed: ", CurrentExceptionText()));
    }
    if (!status.ok()) return Finish(status);
    StartWrite(&out_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the answer could not be sent"));
    in_.Clear();
    StartRead(&in_);
  }

  void OnDone() override { delete this; }

 private:
  grpc::Status AnswerOne() {
    const size_t size = in_.Length();
    if (size > kMaxReflectionRequestBytes) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("reflection request of ", size, " bytes over the limit of ",
                                       kMaxReflectionRequestBytes, " bytes"));
    }
    Request request;
    if (absl::Status s = DecodeRequest(in_, caps_, &request); !s.ok()) return ToGrpcStatus(s);
    in_.Clear();
    Response response;
    answers_.Answer(request, &response);
    out_.Clear();
    bool own = false;
    return grpc::SerializationTraits<Response>::Serialize(response, &out_, &own);
  }

  Answerer<Request, Response> answers_;
  const WireCaps& caps_;
  grpc::ByteBuffer in_, out_;
};

}  // namespace

template <typename Generated, typename Request, typename Response>
ReflectionService<Generated, Request, Response>::ReflectionService(std::vector<std::string> services)
    : services_(std::move(services)) {}

template <typename Generated, typename Request, typename Response>
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
ReflectionService<Generated, Request, Response>::ServerReflectionInfo(grpc::CallbackServerContext*) {
  return new ReflectionReactor<Request, Response>(services_, caps_);
}

template class ReflectionService<grpc::reflection::v1::ServerReflection, grpc::reflection::v1::ServerReflectionRequest,
                                 grpc::reflection::v1::ServerReflectionResponse>;
template class ReflectionService<grpc::reflection::v1alpha::ServerReflection,
                                 grpc::reflection::v1alpha::ServerReflectionRequest,
                                 grpc::reflection::v1alpha::ServerReflectionResponse>;

}  // namespace qvi
