// A stand-in for a ferry process with introspection on, for the `ferry` tool's tests: it
// listens on "\0ferry-introspect.<pid>" and answers each connection as its mode says.
// Prints "ready" on stdout once it listens, then serves until killed.
//
//   fake_introspection_server serve [--advance] [--stalled] [--label TEXT]   a valid snapshot
//   fake_introspection_server squat PID                          holds PID's name, claims to be PID
//   fake_introspection_server hang                               never accepts a connection
//   fake_introspection_server mute                               accepts, reads, never answers
//   fake_introspection_server garbage                            answers text that is not JSON
//   fake_introspection_server error                              answers {"error": "..."}
//   fake_introspection_server close                              accepts and closes at once
//
// serve: end 0 (send, "batches", or --label) reports 1000 messages of 64 bytes, with --advance
// 1000 + 100 k at request k (from 0); end 1 (send, "results") 7 messages, blocked (waiting for
// room) since the start when --stalled.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

namespace {

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

std::uint64_t monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1000000000u + static_cast<std::uint64_t>(now.tv_nsec);
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string snapshot(long pid, std::uint64_t request, std::uint64_t started_ns, bool stalled,
                     const std::string& label) {
  std::uint64_t now = monotonic_ns();
  std::uint64_t messages = 1000 + 100 * request;
  std::string blocked = stalled ? std::to_string(now - started_ns) : "0";
  return "{\"version\":1,\"pid\":" + std::to_string(pid) +
         ",\"program\":\"fake_server\",\"role\":\"worker\",\"rank\":2,\"monotonic_ns\":" + std::to_string(now) +
         ",\"ends\":[{\"id\":0,\"direction\":\"send\",\"label\":" + json_string(label) +
         ",\"transport\":\"shm_ring\",\"peer_pid\":1,\"state\":\"open\",\"messages\":" + std::to_string(messages) +
         ",\"bytes\":" + std::to_string(messages * 64) + ",\"tensors\":" + std::to_string(messages) +
         ",\"new_segments\":3,\"in_flight\":2,\"blocked_ns\":0,\"blocked_now\":false,\"last_activity_ns\":" +
         std::to_string(now) +
         "},{\"id\":1,\"direction\":\"send\",\"label\":\"results\",\"transport\":\"pipe\",\"peer_pid\":null,"
         "\"state\":\"open\",\"messages\":7,\"bytes\":448,\"tensors\":0,\"new_segments\":0,\"in_flight\":0,"
         "\"blocked_ns\":" +
         blocked + ",\"blocked_now\":" + (stalled ? "true" : "false") +
         ",\"last_activity_ns\":" + std::to_string(started_ns) +
         "}],\"listeners\":[{\"address\":\"unix:/tmp/fake.sock\",\"accepted\":4,"
         "\"refused\":{\"bad_handshake\":2},\"handshakes_in_progress\":1}],"
         "\"shared_memory\":{\"segments\":3,\"segment_bytes\":25165824,\"bytes_in_use\":16777216,\"hits\":41},"
         "\"cuda\":null,"
         "\"workers\":[{\"rank\":0,\"pid\":4242,\"state\":\"exited\",\"exit_code\":0,\"signal\":null}],"
         "\"fanouts\":[{\"kind\":\"distributor\",\"label\":\"work\",\"consumers\":[{\"index\":0,\"transport\":"
         "\"shm_ring\",\"sent\":10,\"delivered\":9,\"in_flight\":1,\"window\":4}]}]}\n";
}

int listen_on(long name_pid) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::string name = "ferry-introspect." + std::to_string(name_pid);
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0) die("bind");
  if (::listen(fd, 16) != 0) die("listen");
  return fd;
}

void send_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    ssize_t wrote = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (wrote <= 0) return;
    done += static_cast<std::size_t>(wrote);
  }
}

// Reads up to the request's line feed (or end of file).
void read_request(int fd) {
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') {
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fake_introspection_server MODE [ARGS]\n");
    return 2;
  }
  std::string mode = argv[1];
  long pid = ::getpid();
  long name_pid = mode == "squat" && argc > 2 ? std::atol(argv[2]) : pid;
  bool stalled = false;
  bool advance = false;
  std::string label = "batches";
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--stalled") == 0) stalled = true;
    if (std::strcmp(argv[i], "--advance") == 0) advance = true;
    if (std::strcmp(argv[i], "--label") == 0 && i + 1 < argc) label = argv[++i];
  }
  int listener = listen_on(name_pid);
  std::printf("ready\n");
  std::fflush(stdout);
  std::uint64_t started = monotonic_ns();
  if (mode == "hang") {
    for (;;) ::pause();
  }
  for (std::uint64_t request = 0;; ++request) {
    int client = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    if (mode == "close") {
      ::close(client);
      continue;
    }
    read_request(client);
    if (mode == "mute") {
      ::pause();  // holds the connection until killed
    } else if (mode == "garbage") {
      send_all(client, "\x1b[2Jthis is not json\n");
    } else if (mode == "error") {
      send_all(client, "{\"error\":\"unknown request\"}\n");
    } else {
      send_all(client, snapshot(name_pid, advance ? request : 0, started, stalled, label));
    }
    ::close(client);
  }
}
