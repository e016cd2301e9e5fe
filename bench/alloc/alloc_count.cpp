// Counts the heap allocations of the process it is preloaded into (LD_PRELOAD), per thread,
// into a file that another process reads while this one runs: bench/alloc/run.sh reads it
// before and after a measured window and divides by the requests served in it.
//
// malloc, calloc, realloc, the aligned allocators and free are taken over and passed on to
// glibc's own (__libc_*: no dlsym, which itself allocates); operator new and every container
// allocate through malloc, so they are counted too. Each thread claims a slot of the file on its
// first call and is its slot's only writer, so a count is a relaxed load and store with no
// read-modify-write on a line another thread writes; the reader sums the slots (aligned 64-bit
// words: no torn reads on x86-64 or arm64). Threads that exit keep their slots: totals only
// grow.
//
// The file (CARACAL_ALLOC_COUNT_FILE) is a header and kSlots slots:
//   header  u64 magic "CARALLOC", u64 slots in use, u64 kSlots, 5 x u64 padding
//   slot    u64 allocations, u64 frees, u64 bytes asked for, 5 x u64 padding
// Calls before the file is mapped (the dynamic loader's, the constructors before this one) and
// calls of threads beyond kSlots land in a slot of their own that is not in the file.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* p, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void __libc_free(void* p);
}

namespace {

constexpr uint64_t kMagic = 0x434f4c4c41524143ULL;  // "CARALLOC", little-endian
constexpr uint32_t kSlots = 1024;

struct alignas(64) Slot {
  std::atomic<uint64_t> allocations;
  std::atomic<uint64_t> frees;
  std::atomic<uint64_t> bytes;
};
struct alignas(64) Header {
  uint64_t magic;
  std::atomic<uint64_t> used;
  uint64_t slots;
};
static_assert(sizeof(Slot) == 64 && sizeof(Header) == 64);

Header* header = nullptr;  // set once by map_file(), before main()
Slot* slots = nullptr;
Slot unmapped;  // calls before the file is mapped, and threads beyond kSlots

// initial-exec: a preloaded library's TLS is static, and its access then never calls malloc.
__attribute__((tls_model("initial-exec"))) thread_local Slot* own = nullptr;

Slot& slot() {
  if (own == nullptr) {
    if (header == nullptr) return unmapped;
    const uint64_t i = header->used.fetch_add(1, std::memory_order_relaxed);
    own = i < kSlots ? &slots[i] : &unmapped;
  }
  return *own;
}

// One writer per slot (the unmapped one aside, whose counts are not read): a load and a store.
void bump(std::atomic<uint64_t>& c, uint64_t by) {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}
void counted(size_t size) {
  Slot& s = slot();
  bump(s.allocations, 1);
  bump(s.bytes, size);
}

__attribute__((constructor(101))) void map_file() {
  const char* path = std::getenv("CARACAL_ALLOC_COUNT_FILE");
  if (path == nullptr) return;
  const int fd = ::open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const size_t length = sizeof(Header) + kSlots * sizeof(Slot);
  void* m = MAP_FAILED;
  // Blocks allocated now, not at the first store to each page: a store to a page of a sparse
  // file that the file system then fails to back is a SIGBUS in the program counted.
  if (::posix_fallocate(fd, 0, static_cast<off_t>(length)) == 0) {
    m = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (m == MAP_FAILED) return;
  auto* h = static_cast<Header*>(m);
  h->magic = kMagic;
  h->slots = kSlots;
  slots = reinterpret_cast<Slot*>(h + 1);
  header = h;
}

}  // namespace

extern "C" {

void* malloc(size_t size) {
  counted(size);
  return __libc_malloc(size);
}

void* calloc(size_t count, size_t size) {
  counted(count * size);
  return __libc_calloc(count, size);
}

// A realloc is an allocation whatever it does: the data path should make none.
void* realloc(void* p, size_t size) {
  counted(size);
  return __libc_realloc(p, size);
}

void* memalign(size_t alignment, size_t size) {
  counted(size);
  return __libc_memalign(alignment, size);
}

void* aligned_alloc(size_t alignment, size_t size) {
  return memalign(alignment, size);
}

int posix_memalign(void** out, size_t alignment, size_t size) {
  void* p = memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

void* valloc(size_t size) {
  return memalign(static_cast<size_t>(::sysconf(_SC_PAGESIZE)), size);
}

void free(void* p) {
  if (p == nullptr) return;
  bump(slot().frees, 1);
  __libc_free(p);
}

}  // extern "C"
