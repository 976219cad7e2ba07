// The explanation page at / on the HTTP port (docs/serving.md, "The explanation page"): one HTML file
// with its style and script inline, compiled in from server/http/page/, so that it works air-gapped and
// with no file beside the binary. The browser fetches nothing else; the script calls the JSON routes.
#ifndef QVI_SERVER_HTTP_EXPLAIN_PAGE_H_
#define QVI_SERVER_HTTP_EXPLAIN_PAGE_H_

#include <string>

#include "server/http/http_server.h"

namespace qvi {

// The page and the headers it is served with: a Content-Security-Policy that lets only its own script
// (by SHA-256) run and its script call only this origin, nosniff, and no caching across versions.
// Built once; the same object for every request.
const HttpResponse& ExplainPageResponse();

// 'sha256-<base64>' of `script`, the form a Content-Security-Policy source takes.
std::string CspScriptHash(const std::string& script);

}  // namespace qvi

#endif  // QVI_SERVER_HTTP_EXPLAIN_PAGE_H_
