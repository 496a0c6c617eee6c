#include <gtest/gtest.h>
TEST(Spec, Placeholder) {}
