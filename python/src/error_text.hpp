// ferry's C++ error messages as a Python user reads them: the C++ names they give as
// advice (WorkerGroup::join(), ChannelOptions::close_linger, StartMethod::Spawn ...) become
// the Python APIs that do the same.
#pragma once

#include <string>
#include <string_view>

namespace ferry::python {

/// `message` with every C++ name of the table in error_text.cpp replaced by its Python name.
std::string python_error_text(std::string_view message);

}  // namespace ferry::python
