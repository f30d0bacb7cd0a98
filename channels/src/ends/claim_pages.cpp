#include "ends/claim_pages.hpp"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

#include "ferry/detail/thread_annotations.hpp"
#include "ferry/error.hpp"

namespace ferry::detail {

namespace {
constexpr std::size_t kPageBytes = 4096;
constexpr std::size_t kWordsPerPage = kPageBytes / sizeof(std::atomic<std::uint64_t>);
}  // namespace

// A page of claim words, as this process sees it.
struct ClaimPage {
  std::atomic<std::uint64_t>* words = nullptr;          // kWordsPerPage words, MAP_SHARED
  std::size_t live = 0;                                 // handed out, not given back
  std::size_t never_used = 0;                           // words [never_used, kWordsPerPage) never handed out
  std::array<std::uint16_t, kWordsPerPage> reusable{};  // given back before any fork since taken
  std::size_t reusable_count = 0;
  bool inherited = false;  // mapped by the parent before this process was forked: hands out nothing

  bool can_hand_out() const noexcept { return !inherited && (reusable_count > 0 || never_used < kWordsPerPage); }
};

namespace {

class ClaimPages {
 public:
  ClaimPages() {
    // (The analysis cannot follow a lock taken in one handler and released in another.)
    const int rc = ::pthread_atfork([]() FERRY_NO_THREAD_SAFETY_ANALYSIS { instance().mutex_.lock(); },
                                    [] { instance().after_fork(false); }, [] { instance().after_fork(true); });
    if (rc != 0) throw_system_error("pthread_atfork for the claim word pages", rc);
  }

  static ClaimPages& instance() {
    static ClaimPages* const pages = new ClaimPages();  // never destroyed: ends may outlive statics
    return *pages;
  }

  ClaimWord take(std::uint64_t initial) {
    const detail::MutexLock lock(mutex_);
    ClaimPage& page = page_with_room();
    std::size_t index = 0;
    if (page.reusable_count > 0) {
      index = page.reusable[--page.reusable_count];
    } else {
      index = page.never_used++;
    }
    ++page.live;
    std::atomic<std::uint64_t>* word = &page.words[index];
    word->store(initial, std::memory_order_release);
    return ClaimWord{word, &page, forks_};
  }

  void give_back(const ClaimWord& word) noexcept {
    const detail::MutexLock lock(mutex_);
    ClaimPage* page = word.page;
    if (!page->inherited && word.forks == forks_) {  // no other process can hold a copy of its end
      page->reusable[page->reusable_count++] = static_cast<std::uint16_t>(word.word - page->words);
    }
    if (--page->live > 0) return;
    ::munmap(static_cast<void*>(page->words), kPageBytes);  // other processes keep their mapping
    std::erase(pages_, page);
    delete page;
  }

  std::size_t mapped() noexcept {
    const detail::MutexLock lock(mutex_);
    return pages_.size();
  }

 private:
  ClaimPage& page_with_room() FERRY_REQUIRES(mutex_) {
    for (ClaimPage* page : pages_) {
      if (page->can_hand_out()) return *page;
    }
    pages_.reserve(pages_.size() + 1);  // the push_back below cannot throw
    auto page = std::make_unique<ClaimPage>();
    void* memory = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) throw_errno("mmap of a page of channel ends' claim words");
    page->words = static_cast<std::atomic<std::uint64_t>*>(memory);
    for (std::size_t i = 0; i < kWordsPerPage; ++i) new (&page->words[i]) std::atomic<std::uint64_t>(0);
    pages_.push_back(page.get());
    return *page.release();
  }

  // The lock is held since the prepare handler (in the child: by its only thread), which
  // the analysis cannot follow across handlers.
  void after_fork(bool in_child) noexcept FERRY_NO_THREAD_SAFETY_ANALYSIS {
    ++forks_;  // words taken before now are never handed out again here
    if (in_child) {
      for (ClaimPage* page : pages_) page->inherited = true;  // the parent hands out their unused words
    }
    mutex_.unlock();
  }

  detail::Mutex mutex_;
  std::vector<ClaimPage*> pages_ FERRY_GUARDED_BY(mutex_);  // owned; each unmapped and deleted at its last give_back
  std::uint64_t forks_ FERRY_GUARDED_BY(mutex_) = 0;
};

}  // namespace

ClaimWord take_claim_word(std::uint64_t initial) { return ClaimPages::instance().take(initial); }

void give_back_claim_word(const ClaimWord& word) noexcept { ClaimPages::instance().give_back(word); }

std::size_t claim_pages_mapped() noexcept { return ClaimPages::instance().mapped(); }

}  // namespace ferry::detail
