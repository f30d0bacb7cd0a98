#include "errors.hpp"

#include <exception>

#include "ferry/endpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/peer_credentials.hpp"
#include "error_text.hpp"

namespace py = pybind11;

namespace ferry::python {

void bind_errors(py::module_& module) {
  // Static, as pybind11's own register_exception does: the classes live as long as the module.
  static py::exception<Error> error(module, "Error");
  static py::exception<ChannelClosed> channel_closed(module, "ChannelClosed", error.ptr());
  static py::exception<PeerDied> peer_died(module, "PeerDied", channel_closed.ptr());
  static py::exception<ProtocolError> protocol_error(module, "ProtocolError", error.ptr());
  static py::exception<TypeMismatch> type_mismatch(module, "TypeMismatch", protocol_error.ptr());
  static py::exception<AddressInUse> address_in_use(module, "AddressInUse", error.ptr());
  static py::exception<UntrustedPeer> untrusted_peer(module, "UntrustedPeer", error.ptr());
  error.doc() = "Base class of every error ferry raises.";
  channel_closed.doc() = "The channel cannot carry messages any more: this end or the peer closed it.";
  peer_died.doc() = "The peer process went away without closing its end (crashed or was killed).";
  protocol_error.doc() = "A message broke the wire protocol (truncated, corrupted, too deeply nested ...).";
  type_mismatch.doc() = "The peer sends another message type than ferry.Value.";
  address_in_use.doc() = "A live listener holds the address already.";
  untrusted_peer.doc() = "The peer's user is not allowed to connect (or be connected to).";
  // Most derived first: each C++ class maps to its Python class.
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
    } catch (const Error& e) {
      PyErr_SetString(error.ptr(), python_error_text(e.what()).c_str());
    }
  });
}

}  // namespace ferry::python
