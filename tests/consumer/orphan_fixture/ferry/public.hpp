// A public header of the fixture: it includes one detail header and not the other.
#pragma once
#include "ferry/detail/used.hpp"
