// Timeouts given as any std::chrono::duration, without overflow.
#pragma once

#include <chrono>

namespace ferry {

/// `duration` in nanoseconds, saturated: a duration longer than nanoseconds can hold
/// (std::chrono::milliseconds::max(), hours::max()) becomes nanoseconds::max() instead of
/// wrapping to a negative count, which would mean "do not wait at all". A floating-point
/// duration that is not a number becomes zero (do not wait), not undefined behaviour.
template <class Rep, class Period>
constexpr std::chrono::nanoseconds saturating_nanoseconds(std::chrono::duration<Rep, Period> duration) {
  using Wide = std::chrono::duration<long double, std::nano>;  // holds any count without overflow
  const Wide wide = std::chrono::duration_cast<Wide>(duration);
  if (wide.count() != wide.count()) return std::chrono::nanoseconds::zero();  // NaN
  if (wide >= Wide(static_cast<long double>(std::chrono::nanoseconds::max().count()))) {
    return std::chrono::nanoseconds::max();
  }
  if (wide <= Wide(static_cast<long double>(std::chrono::nanoseconds::min().count()))) {
    return std::chrono::nanoseconds::min();
  }
  if constexpr (std::chrono::treat_as_floating_point_v<Rep>) {
    // Not duration_cast: it multiplies in Rep, and a double just under the limit rounds up
    // to 2^63 ns, which no nanoseconds count holds. The wide value is below the limit.
    return std::chrono::nanoseconds(static_cast<std::chrono::nanoseconds::rep>(wide.count()));
  } else {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(duration);
  }
}

/// How long a blocking call may wait, taken from any std::chrono::duration (5s, 20ms,
/// milliseconds::max() for "as long as it takes") with saturating_nanoseconds().
class Timeout {
 public:
  template <class Rep, class Period>
  constexpr Timeout(std::chrono::duration<Rep, Period> duration)  // NOLINT: implicit on purpose
      : nanoseconds_(saturating_nanoseconds(duration)) {}
  constexpr std::chrono::nanoseconds nanoseconds() const noexcept { return nanoseconds_; }

 private:
  std::chrono::nanoseconds nanoseconds_;
};

}  // namespace ferry
