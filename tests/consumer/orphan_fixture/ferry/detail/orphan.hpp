// Reached from no public header: check_installed_headers.sh must refuse this tree.
#pragma once
