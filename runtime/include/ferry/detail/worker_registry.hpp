// Worker functions registered by name, so that a re-executed program (start method Spawn)
// can find the function it has to run. Users register with FERRY_WORKER (ferry/spawn.hpp);
// this is the type-erased table behind it.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "ferry/detail/unique_fd.hpp"
#include "ferry/worker_context.hpp"

namespace ferry::detail {

/// A function's address as a registry key (any function pointer converts to this, and
/// back to its own type).
using FunctionIdentity = void (*)();

/// Runs the registered worker `function` in a re-executed process: `payload` holds its
/// encoded arguments (see ferry/spawn.hpp). Plain function pointers, one instantiation per
/// worker signature (no std::function to compile in every program that registers one).
using WorkerEntry = void (*)(FunctionIdentity function, WorkerContext& context, UniqueFd payload);
/// Runs the registered worker `function` in a forked child, given a pointer to a std::tuple
/// of its argument values (exactly the types RegisteredWorker::signature names).
using WorkerInvoke = void (*)(FunctionIdentity function, WorkerContext& context, void* values);

/// One registered worker.
struct RegisteredWorker {
  std::string name;
  FunctionIdentity identity = nullptr;
  /// The worker's argument types after the WorkerContext, e.g. "std::tuple<int, ferry::Receiver<Job> >";
  /// a spawn by name must pass exactly these.
  std::string signature;
  WorkerEntry entry = nullptr;    // called by run_exec() with `identity`
  WorkerInvoke invoke = nullptr;  // called by run_forked() with `identity`

  /// Runs the worker in a re-executed process from its argument payload.
  void run_exec(WorkerContext& context, UniqueFd payload) const { entry(identity, context, std::move(payload)); }
  /// Runs the worker in a forked child on its argument values (see WorkerInvoke).
  void run_forked(WorkerContext& context, void* values) const { invoke(identity, context, values); }
};

/// Registers a worker (during static initialization, through FERRY_WORKER). Registering
/// the same name again with the same function is harmless; with another function, every
/// later lookup of the name reports the conflict. `signature` names the argument types
/// after the WorkerContext (type_name of their std::tuple). Returns true.
bool register_worker_entry(std::string_view name, FunctionIdentity identity, std::string_view signature,
                           WorkerEntry entry, WorkerInvoke invoke) noexcept;

/// The worker registered as `name`; throws SpawnError when there is none (or two).
const RegisteredWorker& find_worker(std::string_view name);

/// The worker registered for the function `identity`, or nullptr; throws SpawnError when
/// its name is registered by another function too.
const RegisteredWorker* find_worker(FunctionIdentity identity);

}  // namespace ferry::detail
