-- nn/init.lua: the nn package: Module, Sequential, GRU, Linear, Last and the criterions.
local criterion = require("qgru.nn.criterion")

return {
  Module = require("qgru.nn.module"),
  Sequential = require("qgru.nn.sequential"),
  GRU = require("qgru.nn.gru"),
  Linear = require("qgru.nn.linear"),
  Last = require("qgru.nn.last"),
  Criterion = criterion.Criterion,
  CrossEntropy = criterion.CrossEntropy,
  MSE = criterion.MSE,
}
