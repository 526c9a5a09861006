// The six axes of a parallel grid, and sets of them.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace commgrid {

/// A global rank. Ranks are 0 ... world_size - 1 and world_size <= 2^31 - 1, so a Rank
/// always fits the int of MPI, NCCL and Gloo; 64 bits keep products of sizes exact.
using Rank = std::int64_t;

/// An axis of the grid, named by its token in the order string. gtp_remat is Megatron-core
/// HEAD's sixth axis (weight rematerialization); the seed edition has no such token and
/// gives it size 1, where it changes no group.
enum class Axis : std::uint8_t { tp = 0, cp = 1, ep = 2, dp = 3, pp = 4, gtp_remat = 5 };

inline constexpr int kNumAxes = 6;
inline constexpr std::array<Axis, kNumAxes> kAllAxes = {Axis::tp, Axis::cp, Axis::ep,
                                                        Axis::dp, Axis::pp, Axis::gtp_remat};
/// The five axes of Megatron-core at the seed (the tokens its order accepts).
inline constexpr std::array<Axis, 5> kSeedAxes = {Axis::tp, Axis::cp, Axis::ep, Axis::dp, Axis::pp};

/// The order token of an axis: "tp", "cp", "ep", "dp", "pp" or "gtp_remat".
constexpr std::string_view axis_name(Axis a) noexcept {
  constexpr std::array<std::string_view, kNumAxes> names = {"tp", "cp", "ep",
                                                            "dp", "pp", "gtp_remat"};
  return names[static_cast<int>(a)];
}

/// A set of axes (a token string such as "tp-pp"); the order inside the set is irrelevant.
class AxisSet {
 public:
  constexpr AxisSet() = default;
  constexpr AxisSet(std::initializer_list<Axis> axes) {
    for (Axis a : axes) bits_ |= bit(a);
  }
  [[nodiscard]] constexpr bool contains(Axis a) const noexcept { return (bits_ & bit(a)) != 0; }
  [[nodiscard]] constexpr bool empty() const noexcept { return bits_ == 0; }
  /// The set with axis a added.
  [[nodiscard]] constexpr AxisSet with(Axis a) const noexcept {
    AxisSet s = *this;
    s.bits_ |= bit(a);
    return s;
  }
  constexpr bool operator==(const AxisSet&) const = default;

 private:
  static constexpr std::uint8_t bit(Axis a) noexcept {
    return static_cast<std::uint8_t>(1u << static_cast<unsigned>(a));
  }
  std::uint8_t bits_ = 0;
};

}  // namespace commgrid
