#include "share_binding.hpp"

#include <cstddef>
#include <cstdint>

#include "export_registry.hpp"

namespace py = pybind11;

namespace ferry::python {

void bind_share(py::module_& module) {
  module.def(
      "_in_ferry_memory",
      [](std::uintptr_t address, std::size_t bytes) {
        // NOLINTNEXTLINE(performance-no-int-to-ptr): Python hands the address over as an integer
        return ExportRegistry::instance().find(reinterpret_cast<const std::byte*>(address), bytes) != nullptr;
      },
      py::arg("address"), py::arg("nbytes"),
      "Whether [address, address + nbytes) lies in a living ferry storage handed to torch or NumPy.");
}

}  // namespace ferry::python
