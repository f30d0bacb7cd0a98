#include "handover_binding.hpp"

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "ends_binding.hpp"
#include "ferry/detail/frame_channel.hpp"
#include "ferry/end_description.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// The description as bytes (cereal's binary archive, as _end_from_description reads it)
// and its descriptors, which the caller duplicates into the other process.
py::tuple describe(const EndDescription& description) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive archive(out);
    archive(description);
  }
  py::list fds;
  for (const std::int32_t fd : description.fds) fds.append(fd);
  return py::make_tuple(py::bytes(out.str()), fds);
}

// Refuses, in Python's terms, an end whose protocol state lives in this process.
template <class Core>
void require_fresh(Core& core, const char* role) {
  if (core.used()) {
    throw Error(std::string("cannot pickle a ferry.") + role + " that has already " +
                (std::string(role) == "Sender" ? "sent" : "received") +
                ": its protocol state (leases, buffered bytes) lives in this process. Pickle a fresh end, or "
                "pass it as an argument of a multiprocessing.Process of the 'fork' context, which inherits it");
  }
}

}  // namespace

void bind_handover(py::module_& module) {
  module.def(
      "_describe_for_handover",
      [](py::handle end) -> py::tuple {
        if (py::isinstance<PySender>(end)) {
          Sender<PyValue>& sender = end.cast<PySender&>().end();
          if (sender.transport() != Transport::InProcess) require_fresh(detail::EndAccess::core(sender), "Sender");
          return describe(describe_end(sender));
        }
        Receiver<PyValue>& receiver = end.cast<PyReceiver&>().end();
        if (receiver.transport() != Transport::InProcess) require_fresh(detail::EndAccess::core(receiver), "Receiver");
        return describe(describe_end(receiver));
      },
      py::arg("end"),
      "(description bytes, [fd, ...]) of a fresh end, for rebuilding it in another process from duplicates "
      "of those descriptors.");
  module.def(
      "_hand_away",
      [](py::handle end) {
        if (py::isinstance<PySender>(end)) {
          detail::EndAccess::core(end.cast<PySender&>().end()).hand_away();
        } else {
          detail::EndAccess::core(end.cast<PyReceiver&>().end()).hand_away();
        }
      },
      py::arg("end"),
      "Marks an end described by _describe_for_handover as handed away (no process holding this copy may use "
      "it) and lets go of this copy's descriptors.");
  module.def(
      "_rebuild_end",
      [](const py::bytes& bytes, const py::list& fds) -> py::object {
        EndDescription description = parse_description(std::string(bytes));
        description.fds.clear();
        for (const py::handle fd : fds) description.fds.push_back(fd.cast<std::int32_t>());
        if (description.role == EndRole::Sender) {
          return py::cast(std::make_unique<PySender>(sender_from_description<PyValue>(description)));
        }
        return py::cast(std::make_unique<PyReceiver>(receiver_from_description<PyValue>(description)));
      },
      py::arg("description"), py::arg("fds"),
      "Rebuilds an end from _describe_for_handover's description and descriptors this process owns "
      "(duplicates of the originals); takes them over, also when it raises.");

  auto sender = py::reinterpret_borrow<py::class_<PySender>>(module.attr("Sender"));
  sender.def(
      "detach", [](PySender& self) { self.end().detach(); },
      "Lets go of this process's copy without ending the stream: after os.fork(), in the process that gives "
      "the end to the other (which calls adopt()).");
  sender.def(
      "adopt", [](PySender& self) { self.end().adopt(); },
      "Makes this process the end's owner (after os.fork(), in the process that takes it over); the process "
      "that owned it before is refused with ferry.EndOwnedElsewhere.");
  auto receiver = py::reinterpret_borrow<py::class_<PyReceiver>>(module.attr("Receiver"));
  receiver.def(
      "detach", [](PyReceiver& self) { self.end().detach(); },
      "Lets go of this process's copy without closing the end for the process that took it over.");
  receiver.def(
      "adopt", [](PyReceiver& self) { self.end().adopt(); },
      "Makes this process the end's owner (after os.fork(), in the process that takes it over).");
}

}  // namespace ferry::python
