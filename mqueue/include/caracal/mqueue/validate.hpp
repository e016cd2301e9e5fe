// Validation of a region header that a peer hands over. Every field is checked before anything
// touches the region; the first bad field is refused with a message that names it, its value
// and what was expected.
#pragma once

#include <cstdint>

#include "caracal/core/status.hpp"
#include "caracal/mqueue/layout.hpp"

namespace caracal::mqueue {

// Checks `h` for a region of which `mapped_bytes` are reachable (the mapping's or the
// registration's size). Accepts any layout whose parts are aligned, ordered and in bounds, not
// only the one compute_layout makes.
Status validate_region(const RegionHeader& h, uint64_t mapped_bytes);

// Checks what an agent asks for before it allocates anything.
Status validate_geometry(const RegionGeometry& g);

}  // namespace caracal::mqueue
