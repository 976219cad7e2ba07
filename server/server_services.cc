// The server's gRPC services over the core: the native API, OIP (and its repository extension), TEI's, gRPC's
// health service and the reflection that lists them all.
#include <grpcpp/health_check_service_interface.h>

#include <string>
#include <vector>

#include "grpc/health/v1/health.pb.h"
#include "server/server.h"

namespace qvi {

void Server::MakeGrpcServices() {
  oip_api_ = std::make_unique<OipApi>(repository_.get(), core_->limits(), calls_.get(), &serving_);
  service_ = std::make_unique<InferenceServiceImpl>(frontend_core_.get(), repository_.get(), calls_.get(),
                                                    options_.limits.max_stream_inflight);
  oip_ = std::make_unique<OipServiceImpl>(frontend_core_.get(), oip_api_.get(), calls_.get());
  oip_repository_ = std::make_unique<OipRepository>(repository_.get());
  repository_service_ =
      std::make_unique<RepositoryService>(oip_repository_.get(), calls_.get(), DefaultWireCaps(core_->limits()));

  tei_ = std::make_unique<TeiGrpc>(TeiGrpc{frontend_core_.get(), calls_.get(), repository_.get(),
                                           options_.models.default_model, DefaultWireCaps(core_->limits()),
                                           options_.limits.max_stream_inflight});
  tei_info_ = std::make_unique<TeiInfoService>(tei_.get());
  tei_predict_ = std::make_unique<TeiPredictService>(tei_.get());
  tei_tokenize_ = std::make_unique<TeiTokenizeService>(tei_.get());

  grpc::EnableDefaultHealthCheckService(true);
  // gRPC's health service carries no descriptor, so reflection could list but not describe it (and grpcurl
  // would refuse it); touching the generated health.proto links its descriptor in, where reflection finds it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  // Reflection of our own (reflection_service.h): gRPC's plugin parses what it is sent unbounded.
  const std::vector<std::string> services = {qvi::serving::v1::Inference::service_full_name(),
                                             inference::GRPCInferenceService::service_full_name(),
                                             tei::v1::Info::service_full_name(),
                                             tei::v1::Predict::service_full_name(),
                                             tei::v1::Tokenize::service_full_name(),
                                             "grpc.health.v1.Health",
                                             reflection_v1::ServerReflection::service_full_name(),
                                             reflection_v1alpha::ServerReflection::service_full_name()};
  reflection_ = std::make_unique<ReflectionV1>(services);
  reflection_alpha_ = std::make_unique<ReflectionV1Alpha>(services);
}

}  // namespace qvi
