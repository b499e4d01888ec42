// A stand-in TensorRT library for layout tests (no GPU, no TensorRT headers): it defines
// createInferRuntime_INTERNAL, returning fake wrapper objects whose implementation tables print
// "SPY <kind> <slot>" on stderr for every call. Preloaded under NVIDIA's Python bindings, or linked
// into a program built on abi.h, it shows which slot each method call uses. $SPY_RETURN
// ("kind:slot=kind,..."; kinds 1 runtime, 2 engine, 3 context, 4 runtime config) says which slots
// return a further fake object; every other call returns 0 (or its result pointer).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <typeinfo>
#include <utility>

namespace {
constexpr int kSlots = 128;
constexpr int kKinds = 5;
const char* const kNames[kKinds] = {"?", "runtime", "engine", "context", "config"};

struct Impl { void** vtable; };
struct Wrap { void** vtable; Impl* impl; };
Impl g_impl[kKinds];
Wrap g_wrap[kKinds];
int g_returns[kKinds][kSlots];

uintptr_t report(int kind, int slot, uintptr_t a0, uintptr_t a1) {
  // A method returning a large struct gets its result pointer first and the object second.
  const bool result_first = a1 == reinterpret_cast<uintptr_t>(&g_impl[kind]);
  char line[64];
  int n = snprintf(line, sizeof line, "SPY %s %d\n", kNames[kind], slot);
  (void)!write(2, line, static_cast<size_t>(n));
  if (int r = g_returns[kind][slot]) return reinterpret_cast<uintptr_t>(&g_wrap[r]);
  return result_first ? a0 : 0;
}

template <int Kind, int Slot>
uintptr_t entry(uintptr_t a0, uintptr_t a1, uintptr_t, uintptr_t, uintptr_t, uintptr_t) {
  return report(Kind, Slot, a0, a1);
}
uintptr_t wrapper_entry(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t) { return 0; }

template <int Kind, int... Slot>
void** table(std::integer_sequence<int, Slot...>) {
  static void* t[] = {reinterpret_cast<void*>(&entry<Kind, Slot>)...};
  return t;
}

__attribute__((constructor)) void init() {
  using All = std::make_integer_sequence<int, kSlots>;
  void** tables[kKinds] = {nullptr, table<1>(All{}), table<2>(All{}), table<3>(All{}), table<4>(All{})};
  // A wrapper's table: type information first (bindings may ask for an object's dynamic type),
  // then its destructors.
  static void* wrapper_table[4] = {const_cast<std::type_info*>(&typeid(Wrap)), reinterpret_cast<void*>(&wrapper_entry),
                                   reinterpret_cast<void*>(&wrapper_entry), reinterpret_cast<void*>(&wrapper_entry)};
  for (int k = 1; k < kKinds; ++k) {
    g_impl[k].vtable = tables[k];
    g_wrap[k] = {wrapper_table + 1, &g_impl[k]};
  }
  const char* s = getenv("SPY_RETURN");
  int kind, slot, ret, used;
  while (s != nullptr && sscanf(s, "%d:%d=%d%n", &kind, &slot, &ret, &used) == 3) {
    if (kind > 0 && kind < kKinds && slot >= 0 && slot < kSlots && ret > 0 && ret < kKinds) g_returns[kind][slot] = ret;
    s += used;
    s = *s == ',' ? s + 1 : nullptr;
  }
}
}  // namespace

extern "C" __attribute__((visibility("default"))) void* createInferRuntime_INTERNAL(void*, int32_t) noexcept {
  return &g_wrap[1];
}
extern "C" __attribute__((visibility("default"))) int32_t getInferLibVersion() noexcept { return 10601; }
