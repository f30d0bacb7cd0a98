// Sends a tensor to a forked child through ferry and checks that it arrives: proves that a
// project outside ferry can build and link against it.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ferry/ferry.hpp>

struct Message {
  std::string text;
  ferry::Tensor values;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(text, values);
  }
};

int main() {
  auto [tx, rx] = ferry::channel<Message>(ferry::Transport::UnixSocket);
  const pid_t child = fork();
  if (child == 0) {
    tx.detach();
    auto message = rx.recv();
    const bool ok = message && message->text == "hello" && message->values.at<float>({2}) == 3.0f;
    _exit(ok ? 0 : 1);
  }
  rx.close();
  tx.send(Message{"hello", ferry::Tensor::from({1.0f, 2.0f, 3.0f}, ferry::Device::SharedCpu)});
  tx.close();
  int status = 0;
  waitpid(child, &status, 0);
  const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("consumer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
