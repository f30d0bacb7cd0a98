// How the arguments of ferry::spawn reach each worker: channel ends are handed over (a
// worker owns the ends it receives), per_rank() values are split by rank, everything else
// is copied to every worker. Used by ferry/spawn.hpp.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <cereal/details/traits.hpp>
#include <cereal/types/utility.hpp>

#include "ferry/channel.hpp"
#include "ferry/detail/archive.hpp"
#include "ferry/detail/live_ends.hpp"
#include "ferry/detail/type_name.hpp"
#include "ferry/duplex.hpp"
#include "ferry/end_description.hpp"
#include "ferry/per_rank.hpp"
#include "ferry/worker_context.hpp"
#include "ferry/worker_error.hpp"

namespace ferry::detail {

template <class A>
struct IsEnd : std::false_type {};
template <class T>
struct IsEnd<Sender<T>> : std::true_type {};
template <class T>
struct IsEnd<Receiver<T>> : std::true_type {};

template <class A>
struct IsDuplexEnd : std::false_type {};
template <class Out, class In>
struct IsDuplexEnd<DuplexEnd<Out, In>> : std::true_type {};

template <class A>
struct IsEndVector : std::false_type {};
template <class E>
struct IsEndVector<std::vector<E>> : std::bool_constant<IsEnd<E>::value || IsDuplexEnd<E>::value> {};

/// True for a value that holds channel ends (an end, a duplex end, or a vector of either).
template <class V>
inline constexpr bool holds_ends = IsEnd<V>::value || IsDuplexEnd<V>::value || IsEndVector<V>::value;

/// What spawn() stores for one argument, and what a worker gets from it.
template <class A>
struct ArgTraits {  // a plain value or an end: the same argument for every worker
  using Worker = A;
  static constexpr bool per_rank = false;
  static A& for_rank(A& arg, int /*rank*/) { return arg; }
  static std::size_t count(const A& /*arg*/) { return 0; }
};
template <class T>
struct ArgTraits<PerRank<T>> {
  using Worker = T;
  static constexpr bool per_rank = true;
  static T& for_rank(PerRank<T>& arg, int rank) { return arg.values()[static_cast<std::size_t>(rank)]; }
  static std::size_t count(const PerRank<T>& arg) { return arg.values().size(); }
};

/// The value worker code receives for a spawn() argument of type A.
template <class A>
using WorkerValue = typename ArgTraits<std::decay_t<A>>::Worker;

/// Calls f(end) for every channel end in `value` (Sender<T>& or Receiver<T>&; both halves
/// of a duplex end).
template <class V, class F>
void for_each_end(V& value, F&& f) {
  if constexpr (IsEnd<V>::value) {
    f(value);
  } else if constexpr (IsDuplexEnd<V>::value) {
    f(value.sender);
    f(value.receiver);
  } else if constexpr (IsEndVector<V>::value) {
    for (auto& end : value) for_each_end(end, f);
  }
}

/// How a worker value travels to a process started by exec: ends as EndDescription.
template <class V>
struct WireTraits {
  using Wire = V;
  static const V& to_wire(const V& value) { return value; }
  static V from_wire(V&& wire) { return std::move(wire); }
};
template <class T>
struct WireTraits<Sender<T>> {
  using Wire = EndDescription;
  static EndDescription to_wire(Sender<T>& end) { return describe_end(end); }
  static Sender<T> from_wire(EndDescription&& wire) { return sender_from_description<T>(wire); }
};
template <class T>
struct WireTraits<Receiver<T>> {
  using Wire = EndDescription;
  static EndDescription to_wire(Receiver<T>& end) { return describe_end(end); }
  static Receiver<T> from_wire(EndDescription&& wire) { return receiver_from_description<T>(wire); }
};
template <class Out, class In>
struct WireTraits<DuplexEnd<Out, In>> {
  using Wire = std::pair<EndDescription, EndDescription>;  // sender, receiver
  static Wire to_wire(DuplexEnd<Out, In>& end) { return {describe_end(end.sender), describe_end(end.receiver)}; }
  static DuplexEnd<Out, In> from_wire(Wire&& wire) {
    return DuplexEnd<Out, In>(sender_from_description<Out>(wire.first), receiver_from_description<In>(wire.second));
  }
};
template <class E>
requires(IsEnd<E>::value || IsDuplexEnd<E>::value) struct WireTraits<std::vector<E>> {
  using Wire = std::vector<typename WireTraits<E>::Wire>;  // an EndDescription or a duplex end's pair per end
  static Wire to_wire(std::vector<E>& ends) {
    Wire wire;
    for (auto& end : ends) wire.push_back(WireTraits<E>::to_wire(end));
    return wire;
  }
  static std::vector<E> from_wire(Wire&& wire) {
    std::vector<E> ends;
    for (auto& description : wire) ends.push_back(WireTraits<E>::from_wire(std::move(description)));
    return ends;
  }
};

template <class V>
using Wire = typename WireTraits<V>::Wire;

/// Appends to `fds` the descriptors of every end in the wire value `value` (an
/// EndDescription, a duplex end's pair of them, or a vector of either; nothing for other
/// values): the descriptors a worker started by exec must inherit.
template <class W>
void append_end_descriptors(const W& value, std::vector<int>& fds) {
  if constexpr (std::is_same_v<W, EndDescription>) {
    fds.insert(fds.end(), value.fds.begin(), value.fds.end());
  } else if constexpr (std::is_same_v<W, std::pair<EndDescription, EndDescription>>) {
    append_end_descriptors(value.first, fds);
    append_end_descriptors(value.second, fds);
  } else if constexpr (std::is_same_v<W, std::vector<EndDescription>> ||
                       std::is_same_v<W, std::vector<std::pair<EndDescription, EndDescription>>>) {
    for (const auto& one : value) append_end_descriptors(one, fds);
  }
}

/// Whether V can travel to a process started by exec (ferry's cereal archives can write
/// and read its wire form).
template <class V>
inline constexpr bool crosses_exec = cereal::traits::is_output_serializable<Wire<V>, FrameOutputArchive>::value&&
    cereal::traits::is_input_serializable<Wire<V>, FrameInputArchive>::value;

/// Throws SpawnError about argument `position` (from 0) of spawn(), of type `type`:
/// "argument N of spawn (type) <problem>".
[[noreturn]] void throw_spawn_argument_error(std::size_t position, std::string_view type, const std::string& problem);
/// validate_argument()'s two errors that name counts (out of line: every argument type
/// instantiates it).
[[noreturn]] void throw_per_rank_count_mismatch(std::size_t position, std::string_view type, std::size_t count,
                                                int world_size);
[[noreturn]] void throw_end_shared_by_workers(std::size_t position, std::string_view type, int world_size);
/// Checks one channel end handed to a worker started by `method` (open, able to cross
/// processes, fresh for StartMethod::Spawn); throws SpawnError about argument `position`.
void check_handed_end(std::size_t position, std::string_view type, bool open, Transport transport, bool used,
                      StartMethod method);

/// Checks one spawn() argument (number `position`, from 0) for a group of `world_size`
/// workers started by `method`; throws SpawnError.
template <class A>
void validate_argument(A& arg, std::size_t position, int world_size, StartMethod method) {
  using Traits = ArgTraits<A>;
  using V = typename Traits::Worker;
  if constexpr (Traits::per_rank) {
    if (Traits::count(arg) != static_cast<std::size_t>(world_size)) {
      throw_per_rank_count_mismatch(position, type_name<A>(), Traits::count(arg), world_size);
    }
  } else if constexpr (holds_ends<V>) {
    bool any = false;
    for_each_end(arg, [&](auto&) { any = true; });
    if (any && world_size > 1) throw_end_shared_by_workers(position, type_name<A>(), world_size);
  }
  if constexpr (holds_ends<V>) {
    for (int rank = 0; rank < (Traits::per_rank ? world_size : 1); ++rank) {
      for_each_end(Traits::for_rank(arg, rank), [&](auto& end) {
        const bool open = end.is_open();
        const bool frames = open && end.transport() != Transport::InProcess;  // a frame core to ask
        check_handed_end(position, type_name<A>(), open, end.transport(), frames && core_used(EndAccess::core(end)),
                         method);
      });
    }
  }
}

/// The untyped cores (as LiveEnd) of the ends worker `rank` gets from `stored`.
template <class Stored>
std::vector<const LiveEnd*> ends_of_rank(Stored& stored, int rank) {
  std::vector<const LiveEnd*> ends;
  std::apply(
      [&](auto&... arg) {
        (for_each_end(ArgTraits<std::decay_t<decltype(arg)>>::for_rank(arg, rank),
                      [&](auto& end) { ends.push_back(as_live_end(EndAccess::core(end))); }),
         ...);
      },
      stored);
  return ends;
}

/// After the workers started: the parent lets go of every end it handed over, without
/// ending their streams (the workers own them now).
template <class Stored>
void release_handed_ends(Stored& stored, int world_size) noexcept {
  std::apply(
      [&](auto&... arg) {
        (
            [&](auto& one) {
              using Traits = ArgTraits<std::decay_t<decltype(one)>>;
              for (int rank = 0; rank < (Traits::per_rank ? world_size : 1); ++rank) {
                for_each_end(Traits::for_rank(one, rank), [](auto& end) { end.detach(); });
              }
            }(arg),
            ...);
      },
      stored);
}

/// Closes every end in a worker's values (its stream then ends cleanly); for ends the
/// worker function took by reference or did not close itself.
template <class Values>
void close_worker_ends(Values& values) noexcept {
  std::apply([](auto&... value) { (for_each_end(value, [](auto& end) { end.close(); }), ...); }, values);
}

/// Calls `fn(context, values...)`, passing each value as an rvalue when `fn` accepts
/// that (parameters by value, const& or &&), else as an lvalue (parameters by &).
template <class Fn, class Values, std::size_t... I>
void invoke_with_values(Fn& fn, WorkerContext& context, Values& values, std::index_sequence<I...>) {
  if constexpr (std::is_invocable_v<Fn&, WorkerContext&, std::tuple_element_t<I, Values>&&...>) {
    std::invoke(fn, context, std::move(std::get<I>(values))...);
  } else {
    std::invoke(fn, context, std::get<I>(values)...);
  }
}

}  // namespace ferry::detail
