// Aligned text tables for the tool's output. Contract: render() returns the header line and
// one line per row, columns separated by two spaces, each as wide as its widest cell, left-
// or right-aligned; no line ends in spaces. Given a width, shrinkable columns are cut (with
// "~") down to their minimum, widest slack first; then droppable columns are left out,
// highest drop rank first; lines still too long are cut at the width. Widths count UTF-8 code points. Cells are shown
// through printable(): text from another process never reaches the terminal as control characters.
#pragma once

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::cli {

/// `text` with control characters (and invalid bytes) replaced by '?'.
std::string printable(std::string_view text);

/// The number of terminal columns `text` (UTF-8, printable) takes: its code points.
std::size_t display_width(std::string_view text);

/// `text` cut to `width` columns; "~" marks a cut.
std::string cut_to_width(std::string_view text, std::size_t width);

enum class Align { left, right };

struct Column {
  std::string header;
  Align align = Align::left;
  std::size_t min_width = 0;  ///< 0: never shrunk; otherwise it may shrink down to this
  int drop_rank = 0;          ///< 0: always shown; otherwise left out (highest first) when too wide
};

class Table {
 public:
  explicit Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  /// Adds a row (missing cells are empty; extra cells are ignored).
  void add_row(std::vector<std::string> cells);
  std::size_t rows() const noexcept { return rows_.size(); }
  /// The header then the rows, fitted into `max_width` columns.
  std::vector<std::string> render(std::size_t max_width = std::numeric_limits<std::size_t>::max()) const;

 private:
  /// Each column's width; dropped columns get `dropped`.
  std::vector<std::size_t> fitted_widths(std::size_t max_width) const;
  static constexpr std::size_t dropped = std::numeric_limits<std::size_t>::max();
  std::string line(const std::vector<std::string>& cells, const std::vector<std::size_t>& widths) const;

  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace ferry::cli
