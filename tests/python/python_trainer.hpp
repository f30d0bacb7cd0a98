// Starting a Python trainer (tests/python/trainer.py) as a separate process that connects
// to this test's listener by address (FERRY_TEST_ADDRESS), or inherits channel ends from it:
// each end travels as a hex-encoded cereal EndDescription in FERRY_TEST_ENDS, its
// descriptors inherited at the same numbers.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "ferry/end_description.hpp"

namespace ferry::test {

/// Forks and execs `python3 trainer.py scenario` with the ends of `ends` (described by
/// describe_end; the caller detaches its copies afterwards) and `address` for it to connect
/// to (may be empty). Returns the child's pid.
pid_t start_python_trainer(const std::string& scenario, const std::vector<EndDescription>& ends,
                           const std::string& address = "");

}  // namespace ferry::test
