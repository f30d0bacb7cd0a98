// Reached from ferry/public.hpp.
#pragma once
