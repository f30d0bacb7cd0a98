#include "ucx_context.hpp"

#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "ferry/error.hpp"

namespace ferry::ucx::detail {
namespace {

std::mutex context_mutex;
std::weak_ptr<UcxContext> live_context;

// Sets `name` unless the user already did (their setting wins).
void default_env(const char* name, const std::string& value) {
  if (::setenv(name, value.c_str(), 0) != 0) throw Error(std::string("setenv(") + name + ") failed");
}

}  // namespace

void check_ucs(ucs_status_t status, const std::string& what) {
  if (status != UCS_OK) throw Error(what + " failed: " + ucs_status_string(status));
}

void refuse_after_fork(pid_t owner, const char* what) {
  if (owner != 0 && owner != ::getpid()) {
    throw Error(std::string(what) +
                ": this ucx end was created in another process and carried across fork; UCX state must not be "
                "used by a forked child: connect to the ucx:// address from the child instead");
  }
}

bool UcxContext::in_owner() const noexcept { return owner_ == ::getpid(); }

std::shared_ptr<UcxContext> UcxContext::get(const KeepaliveSettings& keepalive) {
  const std::lock_guard lock(context_mutex);
  if (auto context = live_context.lock()) {
    // A context alive in the parent when this process was forked is the parent's: a fresh
    // one is made only once the parent's last ucx end is gone.
    refuse_after_fork(context->owner_, "starting UCX");
    return context;
  }
  default_env("UCX_TCP_KEEPIDLE", std::to_string(keepalive.idle.count()) + "s");
  default_env("UCX_TCP_KEEPINTVL", std::to_string(keepalive.interval.count()) + "s");
  default_env("UCX_TCP_KEEPCNT", std::to_string(keepalive.count));
  // UCX's own warnings about peers that vanished are ferry's errors to report.
  default_env("UCX_LOG_LEVEL", "error");

  ucp_config_t* config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  auto context = std::shared_ptr<UcxContext>(new UcxContext());
  const ucs_status_t status = ucp_init(&params, config, &context->context_);
  ucp_config_release(config);
  check_ucs(status, "ucp_init (starting UCX)");
  context->owner_ = ::getpid();
  live_context = context;
  return context;
}

UcxContext::~UcxContext() {
  // A forked child leaves the parent's UCX alone (its memory is a copy; cleaning up would
  // touch the parent's connections).
  if (context_ != nullptr && in_owner()) ucp_cleanup(context_);
}

}  // namespace ferry::ucx::detail
