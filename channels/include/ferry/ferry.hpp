// ferry: typed channels between processes that move tensors without copying their bytes.
// Include this one header to use all of it.
#pragma once

#include <cereal/types/array.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/tuple.hpp>
#include <cereal/types/unordered_map.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/variant.hpp>
#include <cereal/types/vector.hpp>

#include "ferry/broadcast.hpp"
#include "ferry/channel.hpp"
#include "ferry/cuda.hpp"
#include "ferry/distributor.hpp"
#include "ferry/dtype.hpp"
#include "ferry/duplex.hpp"
#include "ferry/endpoint.hpp"
#include "ferry/error.hpp"
#include "ferry/handle_cache.hpp"
#include "ferry/init.hpp"
#include "ferry/introspection.hpp"
#include "ferry/peer_credentials.hpp"
#include "ferry/select.hpp"
#include "ferry/shared_allocator.hpp"
#include "ferry/spawn.hpp"
#include "ferry/tensor.hpp"
#include "ferry/tensor_wire.hpp"
#include "ferry/wait_interruption.hpp"
