// The machinery behind ferry::spawn (ferry/spawn.hpp, which includes this header at its
// end): payload encoding for exec'd workers, starting the ranks of a WorkerGroup by fork or
// exec, handing over and releasing the parent's ends. Not API.
#pragma once

#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/vector.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ferry/detail/erased_body.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/storage_collector.hpp"
#include "ferry/detail/worker_args.hpp"
#include "ferry/detail/worker_registry.hpp"
#include "ferry/init.hpp"
#include "ferry/tensor_wire.hpp"
#include "ferry/worker_group.hpp"

#include "ferry/spawn.hpp"

namespace ferry::detail {

/// The encoded arguments of one worker: the payload memfd (u32 fd count, the frame's fd
/// numbers as i32, then the frame's bytes), and the encoder that made the frame in it. The
/// encoder keeps the frame's descriptors (tensor segments, the return board) open until the
/// worker has inherited them. started() commits the frame; the encoder's hold ledger then
/// keeps the tensors' blocks pinned until the worker gives them back or exits. Dropped
/// without started() (the worker never started), the frame is rolled back and nothing stays
/// pinned.
class EncodedPayload {
 public:
  EncodedPayload(std::unique_ptr<detail::MessageEncoder> encoder, detail::UniqueFd fd);
  EncodedPayload(EncodedPayload&&) noexcept;
  EncodedPayload& operator=(EncodedPayload&&) = delete;
  ~EncodedPayload();
  /// The payload memfd, for WorkerGroup::start_exec().
  int fd() const noexcept { return fd_.get(); }
  /// The worker `pid` was started and inherited the descriptors. Registers it as a holder
  /// of the frame's blocks, so that they are unpinned when it exits, even before it read
  /// them.
  void started(pid_t pid);

 private:
  std::unique_ptr<detail::MessageEncoder> encoder_;
  detail::UniqueFd fd_;
  bool started_ = false;
};

/// Encodes the wire tuple at `wire`, of type `type`, into a payload for one worker; appends
/// the descriptors of its tensors to `inherited`.
EncodedPayload encode_payload(const void* wire, const detail::SentType& type, std::vector<int>& inherited);

/// Encodes `wire` (a tuple of wire values) into a payload for one worker; appends the
/// descriptors the worker must inherit (its tensors' and its ends') to `inherited`.
template <class WireTuple>
EncodedPayload encode_payload(const WireTuple& wire, std::vector<int>& inherited) {
  EncodedPayload payload = encode_payload(&wire, detail::sent_type<WireTuple>, inherited);
  std::apply([&](const auto&... value) { (append_end_descriptors(value, inherited), ...); }, wire);
  return payload;
}

/// Reads `payload` (an EncodedPayload's memfd, inherited), decodes its frame for a message of
/// `type`, and reads it into `out` (a default-constructed value of that type). Throws
/// ProtocolError for a payload that lies, Error for a missing fd.
void decode_payload_into(detail::UniqueFd payload, const detail::ReceivedType& type, void* out);

/// Decodes a payload into the wire tuple WireTuple.
template <class WireTuple>
WireTuple decode_payload(detail::UniqueFd payload) {
  WireTuple wire{};
  decode_payload_into(std::move(payload), detail::received_type<WireTuple>, &wire);
  return wire;
}

/// Calls the registered function `identity` (a R(*)(WorkerContext&, P...) converted to a
/// FunctionIdentity) with `values` moved in.
template <class R, class... P>
void call_registered(FunctionIdentity identity, WorkerContext& context, std::tuple<std::decay_t<P>...>& values) {
  const auto function = reinterpret_cast<R (*)(WorkerContext&, P...)>(identity);
  [&]<std::size_t... I>(std::index_sequence<I...>) { function(context, static_cast<P&&>(std::get<I>(values))...); }
  (std::index_sequence_for<P...>{});
}

/// RegisteredWorker::entry of a worker taking P...: in a re-executed program, decodes the
/// arguments, rebuilds the ends, runs.
template <class R, class... P>
void run_registered_entry(FunctionIdentity identity, WorkerContext& context, detail::UniqueFd payload) {
  using Values = std::tuple<std::decay_t<P>...>;
  using WireTuple = std::tuple<Wire<std::decay_t<P>>...>;
  WireTuple wire = decode_payload<WireTuple>(std::move(payload));
  Values values = std::apply(
      [](auto&&... one) { return Values(WireTraits<std::decay_t<P>>::from_wire(std::move(one))...); }, std::move(wire));
  call_registered<R, P...>(identity, context, values);
  close_worker_ends(values);
}

/// RegisteredWorker::invoke of a worker taking P...: in a forked child (spawn by name with
/// StartMethod::Fork), the values are at hand.
template <class R, class... P>
void run_registered_invoke(FunctionIdentity identity, WorkerContext& context, void* values_tuple) {
  call_registered<R, P...>(identity, context, *static_cast<std::tuple<std::decay_t<P>...>*>(values_tuple));
}

/// The storages of the tensors among worker `rank`'s arguments (in the values StorageCollector
/// can walk; channel ends hold none).
template <class Stored>
std::vector<std::shared_ptr<const void>> storages_of_rank(Stored& stored, int rank) {
  detail::StorageCollector collector;
  std::apply(
      [&](auto&... arg) {
        const auto collect = [&collector](const auto& value) {
          using V = std::decay_t<decltype(value)>;
          if constexpr (!holds_ends<V>) {
            try {
              collector(value);
            } catch (const cereal::Exception&) {
              // A value cereal finds it cannot save only while saving it (a polymorphic type
              // never registered with CEREAL_REGISTER_TYPE): Fork never saves it, and what it
              // holds is the caller's to keep alive, as for the callable's captures.
            }
          }
        };
        (collect(ArgTraits<std::decay_t<decltype(arg)>>::for_rank(arg, rank)), ...);
      },
      stored);
  return collector.owners();
}

/// Starts every rank of `group` by fork(): worker r runs call(context, values) where
/// `values` is a tuple of its own arguments, moved out of the child's copy of `stored`.
/// The worker's tensors are views of the parent's blocks: the group keeps their storages
/// until the worker is reaped, so that the parent's allocator (or the process the parent
/// received them from) does not recycle a block the worker still reads once the parent
/// drops its own copies.
template <class Stored, class Call>
void start_forked_workers(WorkerGroup& group, Stored& stored, Call&& call) {
  for (int rank = 0; rank < group.size(); ++rank) {
    std::vector<std::shared_ptr<const void>> storages = storages_of_rank(stored, rank);
    group.start_forked(rank, [&](WorkerContext& context) {
      // In the child: drop every end this worker was not given, own the ones it was.
      const std::vector<const LiveEnd*> keep = ends_of_rank(stored, rank);
      abandon_live_ends_except(keep);
      auto values = std::apply(
          [&](auto&... arg) {
            return std::tuple<WorkerValue<decltype(arg)>...>(
                std::move(ArgTraits<std::decay_t<decltype(arg)>>::for_rank(arg, rank))...);
          },
          stored);
      std::apply([](auto&... value) { (for_each_end(value, [](auto& end) { end.adopt(); }), ...); }, values);
      call(context, values);
      close_worker_ends(values);
    });
    group.keep_until_exit(rank, std::move(storages));
  }
}

/// The wire form, for a worker parameter of value type V, of the argument `value`.
template <class V, class U>
Wire<V> make_wire(U& value) {
  if constexpr (holds_ends<V> || holds_ends<U>) {
    static_assert(std::is_same_v<U, V>, "a channel end must be passed as exactly the worker parameter's type");
    return WireTraits<V>::to_wire(value);
  } else {
    return Wire<V>(value);  // a copy, converted to the parameter's type
  }
}

template <class Values, class Stored, std::size_t... I>
auto wire_for_rank(Stored& stored, int rank, std::index_sequence<I...>) {
  using WireTuple = std::tuple<Wire<std::tuple_element_t<I, Values>>...>;
  return WireTuple(make_wire<std::tuple_element_t<I, Values>>(
      ArgTraits<std::tuple_element_t<I, Stored>>::for_rank(std::get<I>(stored), rank))...);
}

/// Starts every rank of `group` by exec of this program, running registered worker
/// `name`, whose parameters have the value types in the tuple `Values`.
template <class Values, class Stored>
void start_exec_workers(WorkerGroup& group, Stored& stored, std::string_view name) {
  static_assert(std::tuple_size_v<Values> == std::tuple_size_v<Stored>,
                "spawn() needs exactly one argument per worker parameter after the WorkerContext");
  for (int rank = 0; rank < group.size(); ++rank) {
    auto wire = wire_for_rank<Values>(stored, rank, std::make_index_sequence<std::tuple_size_v<Stored>>{});
    std::vector<int> inherited;
    EncodedPayload payload = encode_payload(wire, inherited);
    group.start_exec(rank, name, payload.fd(), inherited);
    payload.started(group.pid(rank));
  }
}

template <class F>
struct FunctionTraits : std::false_type {};
template <class R, class... P>
struct FunctionTraits<R (*)(WorkerContext&, P...)> : std::true_type {
  using Values = std::tuple<std::decay_t<P>...>;
};
template <class R, class... P>
struct FunctionTraits<R (*)(WorkerContext&, P...) noexcept> : FunctionTraits<R (*)(WorkerContext&, P...)> {};

template <class... V>
inline constexpr bool all_cross_exec = (crosses_exec<V> && ...);

template <class Values>
struct CrossesExec;
template <class... V>
struct CrossesExec<std::tuple<V...>> : std::bool_constant<all_cross_exec<V...>> {};

/// Releases the parent's copies of handed-over ends when spawn() returns or fails.
template <class Stored>
struct HandedEnds {
  Stored& stored;
  int world_size;
  ~HandedEnds() { release_handed_ends(stored, world_size); }
};

/// register_worker()'s work: records the entry points of a worker taking P... .
template <class R, class... P>
bool register_worker_function(std::string_view name, R (*function)(WorkerContext&, P...)) {
  static_assert(detail::all_cross_exec<std::decay_t<P>...>,
                "every parameter of a registered worker must be serializable with cereal (or be a channel end, a "
                "vector of ends, or a Tensor-holding serializable type)");
  return detail::register_worker_entry(name, reinterpret_cast<detail::FunctionIdentity>(function),
                                       detail::type_name<std::tuple<std::decay_t<P>...>>(),
                                       &detail::run_registered_entry<R, P...>, &detail::run_registered_invoke<R, P...>);
}

/// spawn()'s work. `kMayExec`: whether `options` may ask for StartMethod::Spawn; without it
/// (spawn(n, ...), always Fork) the exec path is not compiled.
template <bool kMayExec, class Fn, class... Args>
WorkerGroup spawn_workers(const SpawnOptions& options, int n, Fn&& fn, Args&&... args) {
  // Without it, a forgotten std::move is a page of std::tuple constructor errors.
  static_assert((std::is_constructible_v<std::decay_t<Args>, Args&&> && ...),
                "spawn() takes its arguments by value, and channel ends (and per_rank() of them) are move-only: "
                "pass them with std::move(end)");
  using Stored = std::tuple<std::decay_t<Args>...>;
  using F = std::decay_t<Fn>;
  Stored stored(std::forward<Args>(args)...);
  WorkerGroup group(n, options);
  detail::HandedEnds<Stored> release{stored, n};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (detail::validate_argument(std::get<I>(stored), I, n, options.start_method), ...);
  }
  (std::index_sequence_for<Args...>{});

  using WorkerValues = std::tuple<detail::WorkerValue<Args>...>;
  constexpr bool by_name = std::is_convertible_v<const F&, std::string_view>;
  if constexpr (by_name) {
    const std::string_view name = fn;
    const detail::RegisteredWorker& worker = detail::find_worker(name);
    const std::string expected = std::string(detail::type_name<WorkerValues>());
    if (worker.signature != expected) {
      throw SpawnError("worker '" + std::string(name) + "' takes the arguments " + worker.signature +
                       " after its WorkerContext, but spawn() was given " + expected +
                       "; pass values of exactly those types");
    }
    if (options.start_method == StartMethod::Fork) {
      detail::start_forked_workers(group, stored, [&worker](WorkerContext& context, WorkerValues& values) {
        worker.run_forked(context, &values);
      });
    } else if constexpr (kMayExec && detail::CrossesExec<WorkerValues>::value) {
      detail::start_exec_workers<WorkerValues>(group, stored, name);
    } else {
      throw SpawnError("the arguments " + expected +
                       " cannot be serialized, so they cannot reach a worker started "
                       "by the spawn start method");
    }
  } else {
    static_assert(std::is_invocable_v<F&, WorkerContext&, detail::WorkerValue<Args>&&...> ||
                      std::is_invocable_v<F&, WorkerContext&, detail::WorkerValue<Args>&...>,
                  "a worker function is called as fn(WorkerContext&, args...) with one value per spawn() argument "
                  "(the element type for per_rank arguments)");
    if (options.start_method == StartMethod::Fork) {
      detail::start_forked_workers(group, stored, [&fn](WorkerContext& context, WorkerValues& values) {
        detail::invoke_with_values(fn, context, values, std::index_sequence_for<Args...>{});
      });
    } else if constexpr (kMayExec && detail::FunctionTraits<F>::value) {
      using Values = typename detail::FunctionTraits<F>::Values;
      const detail::RegisteredWorker* worker =
          detail::find_worker(reinterpret_cast<detail::FunctionIdentity>(static_cast<F>(fn)));
      if (worker == nullptr) {
        throw SpawnError(
            "the spawn start method runs workers by name, and this function is not registered; add "
            "FERRY_WORKER(function_name) at namespace scope in a source file of the program");
      }
      if constexpr (detail::CrossesExec<Values>::value) {
        detail::start_exec_workers<Values>(group, stored, worker->name);
      } else {
        throw SpawnError(
            "the worker's arguments cannot be serialized, so they cannot reach a worker started by the "
            "spawn start method");
      }
    } else {
      throw SpawnError(
          "the spawn start method runs workers by name, so it cannot run a lambda or function object; "
          "write the worker as a function, register it with FERRY_WORKER, and pass the function (or "
          "its name), or use StartMethod::Fork");
    }
  }
  return group;
}
}  // namespace ferry::detail
