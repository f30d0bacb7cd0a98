#include "errors.hpp"

#include <exception>
#include <string>

#include "error_text.hpp"
#include "ferry/endpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/peer_credentials.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// EndOwnedElsewhere with a message in Python's terms (the C++ one names detach()/adopt()
// and ferry::spawn) and the owner's pid as attributes.
void raise_end_owned_elsewhere(PyObject* type, const EndOwnedElsewhere& e) {
  const std::string process = "process " + std::to_string(e.owner()) + (e.owner_alive() ? "" : " (which has exited)");
  const std::string end = "this " + e.role();
  std::string what;
  switch (e.reason()) {
    case EndOwnedElsewhere::Reason::Closed:
      what = end + " was closed by " + process + ", which owned it; this process holds a copy inherited through fork";
      break;
    case EndOwnedElsewhere::Reason::HandedAway:
      what = end + " was handed to another process (pickled: a multiprocessing Process argument, Queue or Pool) by " +
             process + "; it can no longer be used here";
      break;
    case EndOwnedElsewhere::Reason::UsedElsewhere:
      what = end + " belongs to " + process +
             ", which used or adopted it first; this process holds a copy inherited through fork, and two "
             "processes using one end would corrupt its stream";
      break;
  }
  what +=
      ". An end belongs to one process: hand it over instead of sharing it (pass it to "
      "multiprocessing.Process as an argument, or through a multiprocessing Queue or Pool; after os.fork(), "
      "call end.detach() in the process that gives it up and end.adopt() in the one that takes it), or give "
      "each process a channel of its own";
  py::object error = py::reinterpret_steal<py::object>(PyObject_CallFunction(type, "s", what.c_str()));
  if (!error) return;  // the call set an error of its own (memory)
  PyObject_SetAttrString(error.ptr(), "owner", py::int_(e.owner()).ptr());
  PyObject_SetAttrString(error.ptr(), "owner_alive", py::bool_(e.owner_alive()).ptr());
  PyErr_SetObject(type, error.ptr());
}

}  // namespace

void bind_errors(py::module_& module) {
  // Static, as pybind11's own register_exception does: the classes live as long as the module.
  static py::exception<Error> error(module, "Error");
  static py::exception<ChannelClosed> channel_closed(module, "ChannelClosed", error.ptr());
  static py::exception<PeerDied> peer_died(module, "PeerDied", channel_closed.ptr());
  static py::exception<ProtocolError> protocol_error(module, "ProtocolError", error.ptr());
  static py::exception<TypeMismatch> type_mismatch(module, "TypeMismatch", protocol_error.ptr());
  static py::exception<AddressInUse> address_in_use(module, "AddressInUse", error.ptr());
  static py::exception<UntrustedPeer> untrusted_peer(module, "UntrustedPeer", error.ptr());
  static py::exception<EndOwnedElsewhere> end_owned_elsewhere(module, "EndOwnedElsewhere", error.ptr());
  error.doc() = "Base class of every error ferry raises.";
  channel_closed.doc() = "The channel cannot carry messages any more: this end or the peer closed it.";
  peer_died.doc() = "The peer process went away without closing its end (crashed or was killed).";
  protocol_error.doc() = "A message broke the wire protocol (truncated, corrupted, too deeply nested ...).";
  type_mismatch.doc() = "The peer sends another message type than ferry.Value.";
  address_in_use.doc() = "A live listener holds the address already.";
  untrusted_peer.doc() = "The peer's user is not allowed to connect (or be connected to).";
  end_owned_elsewhere.doc() =
      "This end belongs to another process: it was inherited through os.fork() (or a 'fork' "
      "multiprocessing.Process) and that process used it first, adopted it, closed it, or it was "
      "pickled to another process. Attributes: owner (pid), owner_alive.";
  // Most derived first: each C++ class maps to its Python class.
  // NOLINTNEXTLINE(performance-unnecessary-value-param): pybind11's translator type takes it by value
  py::register_exception_translator([](std::exception_ptr raised) {
    try {
      if (raised) std::rethrow_exception(raised);
    } catch (const TypeMismatch& e) {
      PyErr_SetString(type_mismatch.ptr(), python_error_text(e.what()).c_str());
    } catch (const ProtocolError& e) {
      PyErr_SetString(protocol_error.ptr(), python_error_text(e.what()).c_str());
    } catch (const PeerDied& e) {
      PyErr_SetString(peer_died.ptr(), python_error_text(e.what()).c_str());
    } catch (const ChannelClosed& e) {
      PyErr_SetString(channel_closed.ptr(), python_error_text(e.what()).c_str());
    } catch (const AddressInUse& e) {
      PyErr_SetString(address_in_use.ptr(), python_error_text(e.what()).c_str());
    } catch (const UntrustedPeer& e) {
      PyErr_SetString(untrusted_peer.ptr(), python_error_text(e.what()).c_str());
    } catch (const EndOwnedElsewhere& e) {
      raise_end_owned_elsewhere(end_owned_elsewhere.ptr(), e);
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), python_error_text(e.what()).c_str());
    }
  });
}

}  // namespace ferry::python
