// The message of the exception being handled, for the catch-alls that keep a failure to one request
// (std::bad_alloc, say) and log or answer what it was.
#ifndef QVI_SERVER_CORE_BASE_EXCEPTION_TEXT_H_
#define QVI_SERVER_CORE_BASE_EXCEPTION_TEXT_H_

#include <string>

namespace qvi {

// The message of the exception being handled (call only inside a catch block).
std::string CurrentExceptionText();

}  // namespace qvi

#endif  // QVI_SERVER_CORE_BASE_EXCEPTION_TEXT_H_
