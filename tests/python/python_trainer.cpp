#include "python/python_trainer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>

#include <sstream>

#include "ferry/error.hpp"

namespace ferry::test {
namespace {

std::string hex_description(const EndDescription& description) {
  std::ostringstream out;
  {
    cereal::BinaryOutputArchive archive(out);
    archive(description);
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (const unsigned char byte : out.str()) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 15]);
  }
  return hex;
}

}  // namespace

pid_t start_python_trainer(const std::string& scenario, const std::vector<EndDescription>& ends,
                           const std::string& address) {
  // Everything the child needs is prepared before fork: after it, only exec-safe calls.
  std::string encoded = "FERRY_TEST_ENDS=";
  std::vector<int> inherited;
  for (std::size_t i = 0; i < ends.size(); ++i) {
    if (i > 0) encoded += ",";
    encoded += hex_description(ends[i]);
    inherited.insert(inherited.end(), ends[i].fds.begin(), ends[i].fds.end());
  }
  const std::string python_path = std::string("PYTHONPATH=") + FERRY_TEST_PYTHON_PATH;
  const std::string script = FERRY_TEST_TRAINER_SCRIPT;
  const std::string interpreter = FERRY_TEST_PYTHON_EXECUTABLE;
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (!text.starts_with("PYTHONPATH=") && !text.starts_with("FERRY_TEST_")) environment.emplace_back(text);
  }
  environment.push_back(python_path);
  environment.push_back(encoded);
  environment.push_back("FERRY_TEST_ADDRESS=" + address);
  std::vector<char*> envp;
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<char*> argv{const_cast<char*>(interpreter.c_str()), const_cast<char*>(script.c_str()),
                          const_cast<char*>(scenario.c_str()), nullptr};
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork for the Python trainer");
  if (pid == 0) {
    for (const int fd : inherited) {
      const int flags = ::fcntl(fd, F_GETFD);
      if (flags < 0 || ::fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0) ::_exit(126);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace ferry::test
