// Where a tensor's bytes live.
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

/// The kind of memory a storage lives in. The numeric values are part of the wire format.
enum class DeviceKind : std::uint8_t {
  Cpu = 0,        ///< private heap memory of this process
  SharedCpu = 1,  ///< shared memory (a sealed memfd) that can be mapped by other processes
  Cuda = 2,       ///< memory of a CUDA device
};

/// A device: `Device::Cpu`, `Device::SharedCpu` or `Device::Cuda(i)`.
struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;

  static const Device Cpu;
  static const Device SharedCpu;
  /// The CUDA device with ordinal `ordinal`.
  static constexpr Device Cuda(int ordinal) { return Device{DeviceKind::Cuda, ordinal}; }

  bool is_cpu() const { return kind != DeviceKind::Cuda; }
  friend bool operator==(const Device&, const Device&) = default;
  /// "cpu", "shared_cpu" or "cuda:N".
  std::string to_string() const;
};

inline constexpr Device Device::Cpu{DeviceKind::Cpu, 0};
inline constexpr Device Device::SharedCpu{DeviceKind::SharedCpu, 0};

inline std::string Device::to_string() const {
  switch (kind) {
    case DeviceKind::Cpu: return "cpu";
    case DeviceKind::SharedCpu: return "shared_cpu";
    case DeviceKind::Cuda: return "cuda:" + std::to_string(index);
  }
  return "invalid";
}

}  // namespace ferry
