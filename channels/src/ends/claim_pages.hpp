// Where claim words live (end_claim.hpp): many words share one page of anonymous shared
// memory, instead of a page each. Contract:
// - take_claim_word() hands out a word no live end of this process uses, in a page every
//   process forked from now on inherits (MAP_SHARED); give_back_claim_word() returns it. A
//   page is unmapped (in this process) once every word it handed out was given back.
// - Across fork() a word stays with the ends that were made with it, in every process that
//   holds a copy of them: a word taken before a fork is never handed out again (a child may
//   still use, or own, the end it belongs to), and a child never hands out words of the
//   pages it inherited (its parent hands out their unused words). A pthread_atfork handler
//   keeps this straight; a fork while another thread takes a word waits for it.
// - Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/detail/end_claim.hpp"  // ClaimWord

namespace ferry::detail {

/// A word, set to `initial`. Throws SystemError when a new page cannot be mapped.
ClaimWord take_claim_word(std::uint64_t initial);
/// Gives `word` back (it must come from take_claim_word() in this process or its parent).
void give_back_claim_word(const ClaimWord& word) noexcept;
/// The pages this process has mapped for claim words (for tests).
std::size_t claim_pages_mapped() noexcept;

}  // namespace ferry::detail
