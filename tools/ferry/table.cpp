#include "table.hpp"

#include <algorithm>

namespace ferry::cli {
namespace {

constexpr std::size_t gap = 2;

bool continuation(unsigned char byte) { return (byte & 0xC0) == 0x80; }

// The length of the UTF-8 sequence starting with `lead`, or 0 when it is not a valid lead byte.
std::size_t sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

std::string printable(std::string_view text) {
  std::string shown;
  shown.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    auto byte = static_cast<unsigned char>(text[i]);
    std::size_t length = sequence_length(byte);
    bool valid = length > 0 && i + length <= text.size();
    for (std::size_t k = 1; valid && k < length; ++k) valid = continuation(static_cast<unsigned char>(text[i + k]));
    if (!valid || (length == 1 && (byte < 0x20 || byte == 0x7F)) ||
        (length == 2 && byte == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0)) {  // C1 controls
      shown += '?';
      ++i;
      continue;
    }
    shown.append(text.substr(i, length));
    i += length;
  }
  return shown;
}

std::size_t display_width(std::string_view text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return !continuation(static_cast<unsigned char>(c)); }));
}

std::string cut_to_width(std::string_view text, std::size_t width) {
  if (display_width(text) <= width) return std::string(text);
  if (width == 0) return {};
  std::size_t kept = 0;
  std::size_t end = 0;
  while (end < text.size() && kept < width - 1) {
    ++end;
    while (end < text.size() && continuation(static_cast<unsigned char>(text[end]))) ++end;
    ++kept;
  }
  return std::string(text.substr(0, end)) + "~";
}

void Table::add_row(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  for (std::string& cell : cells) cell = printable(cell);
  rows_.push_back(std::move(cells));
}

std::vector<std::size_t> Table::fitted_widths(std::size_t max_width) const {
  std::vector<std::size_t> widths(columns_.size());
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    widths[c] = display_width(columns_[c].header);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], display_width(row[c]));
  }
  std::size_t total = 0;
  for (std::size_t width : widths) total += width;
  total += columns_.empty() ? 0 : gap * (columns_.size() - 1);
  while (total > max_width) {
    std::size_t best = columns_.size();
    std::size_t best_slack = 0;
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      std::size_t floor = std::max(columns_[c].min_width, display_width(columns_[c].header));
      if (columns_[c].min_width == 0 || widths[c] <= floor) continue;
      if (widths[c] - floor > best_slack) {
        best = c;
        best_slack = widths[c] - floor;
      }
    }
    if (best == columns_.size()) break;
    std::size_t cut = std::min(best_slack, total - max_width);
    widths[best] -= cut;
    total -= cut;
  }
  while (total > max_width) {
    std::size_t victim = columns_.size();
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      if (widths[c] == dropped || columns_[c].drop_rank == 0) continue;
      if (victim == columns_.size() || columns_[c].drop_rank > columns_[victim].drop_rank) victim = c;
    }
    if (victim == columns_.size()) break;
    total -= widths[victim] + gap;
    widths[victim] = dropped;
  }
  return widths;
}

std::string Table::line(const std::vector<std::string>& cells, const std::vector<std::size_t>& widths) const {
  std::string out;
  bool first = true;
  for (std::size_t c = 0; c < columns_.size(); ++c) {
    if (widths[c] == dropped) continue;
    std::string cell = cut_to_width(cells[c], widths[c]);
    std::string padding(widths[c] - display_width(cell), ' ');
    if (!first) out += std::string(gap, ' ');
    first = false;
    out += columns_[c].align == Align::right ? padding + cell : cell + padding;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<std::string> Table::render(std::size_t max_width) const {
  std::vector<std::size_t> widths = fitted_widths(max_width);
  std::vector<std::string> headers;
  for (const Column& column : columns_) headers.push_back(column.header);
  std::vector<std::string> lines;
  lines.push_back(line(headers, widths));
  for (const auto& row : rows_) lines.push_back(line(row, widths));
  for (std::string& text : lines) text = cut_to_width(text, max_width);
  return lines;
}

}  // namespace ferry::cli
