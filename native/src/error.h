// Failures inside the runtime travel as exceptions up to the C API (api.cc), which turns them
// into a cd_status and a message; nothing crosses the C boundary as an exception.
#pragma once

#include <stdexcept>
#include <string>

#include "conduit.h"

namespace conduit {

class Error : public std::runtime_error {
 public:
  Error(cd_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  cd_status status() const { return status_; }

 private:
  cd_status status_;
};

}  // namespace conduit
