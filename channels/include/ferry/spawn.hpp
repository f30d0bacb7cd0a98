// ferry::spawn: start worker processes, hand them channel ends and arguments, and
// supervise them through the returned WorkerGroup.
//
//   void consume(ferry::WorkerContext& ctx, ferry::Receiver<Batch> in, int factor);
//   FERRY_WORKER(consume);                          // needed only for StartMethod::Spawn
//
//   auto [tx, rx] = ferry::channel<Batch>(ferry::Transport::UnixSocket);
//   auto workers = ferry::spawn(1, consume, std::move(rx), 3);
//   tx.send(batch);
//   tx.close();
//   workers.join();                                  // throws WorkerFailed if a worker failed
//
// Layering: process supervision (WorkerGroup, init, the worker registry) lives in runtime/
// and knows nothing of channels; this header adds what is channel-aware (handing over
// ends, encoding arguments as a ferry frame), so it lives in channels/.
#pragma once

#include <string_view>
#include <utility>

#include "ferry/init.hpp"
#include "ferry/per_rank.hpp"
#include "ferry/worker_context.hpp"
#include "ferry/worker_group.hpp"

namespace ferry {

namespace detail {
// Defined in ferry/detail/spawn_workers.hpp, included at the end of this header.
template <class R, class... P>
bool register_worker_function(std::string_view name, R (*function)(WorkerContext&, P...));
template <bool kMayExec, class Fn, class... Args>
WorkerGroup spawn_workers(const SpawnOptions& options, int n, Fn&& fn, Args&&... args);
}  // namespace detail

/// Starts `n` workers. Each runs `fn(context, args...)` where `context` is its
/// WorkerContext (rank, world size) and each argument is:
///   - a Sender<T> / Receiver<T> (or a std::vector of them): handed over; the worker owns
///     it, and the parent's copy is released (so end-of-stream and peer death work). An end
///     belongs to one worker: with n > 1 pass ends through per_rank();
///   - per_rank(std::vector<X>): worker r gets element r;
///   - anything else: a copy for every worker (with StartMethod::Spawn it travels
///     serialized with ferry's cereal archives; tensors inside travel as handles). With
///     StartMethod::Fork a worker's tensors are views of the parent's blocks: the group
///     keeps the storages of the tensors in the arguments (in any type cereal can walk;
///     values it cannot save, even at run time, are passed over) until the worker is
///     reaped, so the parent may drop its copies at once. Tensors the callable captures, or
///     that only such values hold, are the caller's to keep alive until join().
/// A worker's ends are closed cleanly when `fn` returns. Channel ends the worker was not
/// given are closed in it (fork), or never reach it (spawn).
///
/// `fn` is a callable (StartMethod::Fork only), a function registered with FERRY_WORKER,
/// or the name of one. Arguments are moved into spawn(): pass ends with std::move.
///
/// Throws SpawnError before any process starts for n <= 0, an unregistered worker, a
/// missing ferry::init (spawn method), an end shared by several workers, a closed or
/// in_process end, or per_rank values that do not match n. The ends it was given are gone
/// then too: let go without ending their streams, so their peers see PeerDied or
/// ChannelClosed.
template <class Fn, class... Args>
WorkerGroup spawn(const SpawnOptions& options, int n, Fn&& fn, Args&&... args) {
  return detail::spawn_workers<true>(options, n, std::forward<Fn>(fn), std::forward<Args>(args)...);
}

/// spawn() with default SpawnOptions (StartMethod::Fork; the exec path is not compiled).
template <class Fn, class... Args>
WorkerGroup spawn(int n, Fn&& fn, Args&&... args) {
  return detail::spawn_workers<false>(SpawnOptions{}, n, std::forward<Fn>(fn), std::forward<Args>(args)...);
}

/// Registers `function` as a worker named `name`, so that a program re-executed by the
/// spawn start method can run it. Use FERRY_WORKER / FERRY_WORKER_NAMED at namespace scope.
template <class R, class... P>
bool register_worker(std::string_view name, R (*function)(WorkerContext&, P...)) {
  return detail::register_worker_function(name, function);
}

}  // namespace ferry

#define FERRY_DETAIL_CONCAT_INNER(a, b) a##b
#define FERRY_DETAIL_CONCAT(a, b) FERRY_DETAIL_CONCAT_INNER(a, b)

/// Registers a worker function under its own name (at namespace scope, in a source file):
/// `void train(ferry::WorkerContext&, ferry::Receiver<Batch>); FERRY_WORKER(train);`
#define FERRY_WORKER(function) FERRY_WORKER_NAMED(#function, function)

/// Registers a worker function (or a captureless lambda, with a leading +) as `name`.
#define FERRY_WORKER_NAMED(name, function)                                                        \
  [[maybe_unused]] static const bool FERRY_DETAIL_CONCAT(ferry_registered_worker_, __COUNTER__) = \
      ::ferry::register_worker(name, function)

// The machinery (not API).
#include "ferry/detail/spawn_workers.hpp"  // IWYU pragma: export
