// Built only where the ferry it uses exports ferry::ucx: a ucx:// listener and client in one
// process, through the same ferry::listen / connect_* as unix: addresses (proves that the
// ucx:// scheme is linked in through the ferry::ucx target alone).
#include <cstdio>
#include <ferry/ferry.hpp>
#include <thread>

int main() {
  ferry::EndpointOptions options;
  options.secret = "consumer";
  ferry::Listener listener = ferry::listen("ucx://127.0.0.1:0", options);
  const std::string address = listener.address();
  int got = 0;
  std::thread client([&] {
    ferry::Receiver<int> rx = ferry::connect_receiver<int>(address, options);
    got = rx.recv().value_or(0);
  });
  ferry::Sender<int> tx = listener.accept_sender<int>();
  tx.send(42);
  client.join();
  std::printf("consumer_ucx: %s\n", got == 42 ? "ok" : "FAILED");
  return got == 42 ? 0 : 1;
}
