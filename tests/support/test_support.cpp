#include "support/test_support.hpp"
